// The switchserve.v1.Generation service (gRPC callback API). Handlers check
// the bearer token and the draining state, validate the request, hand it to
// the GenerationEngine and return; the engine's updates complete the call from
// the engine thread (a stream's messages are serialized and written from the
// service's WriteQueue thread). No engine work runs on gRPC threads (tokenizing a prompt
// is the only model-related work done there).
//
// Thread-safe.
#ifndef SWITCHSERVE_SERVER_GENERATION_SERVICE_H_
#define SWITCHSERVE_SERVER_GENERATION_SERVICE_H_

#include <memory>
#include <string>

#include "engine/model/model_config.h"
#include "engine/runtime/generation_engine.h"
#include "engine/text/tokenizer.h"
#include "server/access_log.h"
#include "server/auth.h"
#include "server/byte_budget.h"
#include "server/call_gate.h"
#include "server/generate_calls.h"
#include "server/metrics/serving_metrics.h"
#include "server/proto_convert.h"
#include "server/request_validation.h"
#include "server/write_queue.h"
#include "switchserve/v1/generation.grpc.pb.h"

namespace switchserve {

struct GenerationServiceOptions {
  GenerationEngine* engine = nullptr;  // must outlive the service
  const Tokenizer* tokenizer = nullptr;
  const ModelConfig* config = nullptr;
  // GetModelInfo's `name`: the served model name (--served-model-name, else
  // the config's name, else the directory's), as the HTTP API's `model`.
  std::string model_name;
  DispatchConfig dispatch;  // the dispatch policy in force
  std::string device;       // the backend's name(): "cpu", "cuda"
  RequestLimits limits;
  const BearerTokenAuth* auth = nullptr;  // null: no token needed
  // Calls whose request metadata is larger (name + value + 32 bytes per
  // entry, as HPACK counts) get RESOURCE_EXHAUSTED; 0: no limit.
  int64_t max_metadata_bytes = 0;
  ServingMetrics* metrics = nullptr;  // null: no metrics; must outlive the service
  CallGate* gate = nullptr;           // drain state shared with HTTP; null: the service's own
  // GenerateStream: tokens per message after the first (--stream-interval).
  int stream_interval = 1;
  // GenerateStream: a stream whose write has waited this long for its client
  // to read (HTTP/2 flow control) is ended RESOURCE_EXHAUSTED and its engine
  // request cancelled (--stream-write-timeout-s).
  double stream_write_timeout_s = 60;
  // GenerateStream: output merged while a write waits, as serialized bytes;
  // a stream past it is ended the same way (--max-stream-buffer-bytes).
  int64_t max_stream_buffer_bytes = int64_t{4} << 20;
  // GenerateStream: the output every stream's client has yet to take, all
  // streams together (serialized bytes merged or being written; shared with
  // the HTTP API's streams, --output-buffer-bytes); a stream whose
  // output does not fit is ended the same way. Null: no shared limit.
  std::shared_ptr<ByteBudget> output_budget;
};

// Every method takes raw byte buffers, so that a malformed request (bad
// wire format, invalid UTF-8) gets a precise INVALID_ARGUMENT
// (server/wire_format.h), after the token check: gRPC's own parsing of a
// typed request answers UNIMPLEMENTED before the handler runs.
using GenerationServiceBase = v1::Generation::WithRawCallbackMethod_Generate<
    v1::Generation::WithRawCallbackMethod_GenerateStream<
        v1::Generation::WithRawCallbackMethod_Tokenize<
            v1::Generation::WithRawCallbackMethod_Detokenize<
                v1::Generation::WithRawCallbackMethod_GetModelInfo<v1::Generation::Service>>>>>;

class GenerationService final : public GenerationServiceBase {
 public:
  explicit GenerationService(const GenerationServiceOptions& options);

  // Draining (the gate's StartDraining): every new call gets UNAVAILABLE;
  // calls already running go on. Every call counts in the gate's
  // calls_in_flight() until its answer is sent.

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStream(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

  // Used by the call objects (server/generate_calls.h).
  GenerationEngine* engine() const { return options_.engine; }
  const TokenDescriber& describer() const { return describer_; }
  WriteQueue& write_queue() { return write_queue_; }
  StreamRegistry& streams() { return streams_; }
  int64_t max_stream_buffer_bytes() const { return options_.max_stream_buffer_bytes; }
  const std::shared_ptr<ByteBudget>& output_budget() const { return options_.output_budget; }
  void CallStarted() { options_.gate->CallStarted(); }
  void CallDone() { options_.gate->CallDone(); }
  // Whether the drain's timeout has passed and the running calls are being
  // ended (CallGate::EndRunningCalls).
  bool ending_running_calls() const { return options_.gate->ending_running_calls(); }
  // Counts (switchserve_requests_total) and logs a Generate* call as it
  // ends, with the status its client sees: before its answer goes out, so
  // that a client reading the metrics after its answer finds its call there.
  void FinishCall(const AccessRecord& record) const;

 private:
  // Auth and draining checks shared by every method; then validation for
  // Generate*. On error the status to finish the call with.
  grpc::Status Admit(grpc::CallbackServerContext* context) const;
  absl::StatusOr<GenerationRequest> Prepare(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer& request) const;
  // Admit and Prepare for Generate*, under the call's request id (taken
  // from or added to its metadata). On error the call is counted and logged.
  absl::StatusOr<GenerationRequest> AdmitGenerate(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer& request,
                                                  const char* method) const;

  GenerationServiceOptions options_;
  TokenDescriber describer_;
  CallGate own_gate_;       // when options.gate is null
  StreamRegistry streams_;  // outlives write_queue_, whose thread sweeps it
  WriteQueue write_queue_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_GENERATION_SERVICE_H_
