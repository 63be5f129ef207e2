#include "server/generation_service.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/text/detokenizer.h"
#include "grpc/support/time.h"
#include "server/generate_calls.h"
#include "server/version.h"
#include "server/wire_format.h"

namespace switchserve {
namespace {

// A call answered at once with `status` (Reactor: unary or server
// streaming). It counts as in flight until gRPC has sent the answer, so that
// shutdown waits for it instead of cancelling it (its client would see
// CANCELLED instead of the answer).
template <typename Reactor>
class AnsweredCall : public Reactor {
 public:
  AnsweredCall(GenerationService* service, const grpc::Status& status) : service_(service) {
    service_->CallStarted();
    this->Finish(status);
  }
  void OnDone() override {
    service_->CallDone();
    delete this;
  }

 private:
  GenerationService* service_;
};
using FinishedCall = AnsweredCall<grpc::ServerUnaryReactor>;
using FailedStream = AnsweredCall<grpc::ServerWriteReactor<grpc::ByteBuffer>>;

// The status a refused call's client sees: a call cancelled (or past its
// deadline) in flight reaches the handler without its message (Prepare's
// CANCELLED), and its client sees the cancellation, not a validation error.
absl::StatusCode RejectionSeenByClient(grpc::CallbackServerContext& context,
                                       absl::StatusCode code) {
  if (code != absl::StatusCode::kCancelled && !context.IsCancelled()) return code;
  return static_cast<absl::StatusCode>(CancelledCallStatus(CancelCauseOf(context)).error_code());
}

// The engine's deadline of a call on the steady clock, from `now`: none
// when it has none, or one too far away to represent.
std::optional<Clock::time_point> SteadyDeadline(const grpc::ServerContextBase& context,
                                                Clock::time_point now) {
  // In whole seconds: a client's "longest" timeout (2562047H, about 2^63 ns)
  // overflowed `now + left` into the past, which cancelled the call at once
  // as DEADLINE_EXCEEDED.
  const std::optional<gpr_timespec> time_left = TimeToDeadline(context);
  if (!time_left) return std::nullopt;
  const gpr_timespec& left = *time_left;
  const auto representable = std::chrono::duration_cast<std::chrono::seconds>(
      Clock::time_point::max() - now - std::chrono::seconds(1));
  if (left.tv_sec >= representable.count()) return std::nullopt;  // as good as none
  return now + std::chrono::seconds(left.tv_sec) + std::chrono::nanoseconds(left.tv_nsec);
}

}  // namespace

namespace {

// How often the WriteQueue thread looks for stalled streams: a quarter of
// the timeout, between 5 ms and 1 s.
std::chrono::steady_clock::duration SweepPeriod(double timeout_s) {
  const double period_s = std::clamp(timeout_s / 4, 0.005, 1.0);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(period_s));
}

}  // namespace

GenerationService::GenerationService(const GenerationServiceOptions& options)
    : options_(options),
      write_queue_(SweepPeriod(options.stream_write_timeout_s),
                   [this, timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(options.stream_write_timeout_s))] {
                     streams_.Sweep(timeout);
                   }) {
  if (options_.gate == nullptr) options_.gate = &own_gate_;
  describer_.tokenizer = options.tokenizer;
  describer_.layout = RouterLayout(*options.config);
}

void GenerationService::FinishCall(const AccessRecord& record) const {
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRequest(RequestProtocol::kGrpc, record.status);
  }
  LogAccess(record);
}

grpc::Status GenerationService::Admit(grpc::CallbackServerContext* context) const {
  if (options_.max_metadata_bytes > 0) {
    int64_t bytes = 0;
    for (const auto& [key, value] : context->client_metadata()) {
      bytes += static_cast<int64_t>(key.size() + value.size()) + 32;
    }
    if (bytes > options_.max_metadata_bytes) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("request metadata of ", bytes, " bytes exceeds --max-metadata-bytes ",
                       options_.max_metadata_bytes));
    }
  }
  if (options_.auth != nullptr) {
    if (grpc::Status status = options_.auth->Check(*context); !status.ok()) return status;
  }
  if (options_.gate->draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down; retry on another replica");
  }
  return grpc::Status::OK;
}

absl::StatusOr<GenerationRequest> GenerationService::Prepare(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer& buffer) const {
  // No message at all (an empty one is valid): the client cancelled, or its
  // deadline passed, before the request arrived.
  if (!buffer.Valid()) return absl::CancelledError("the call ended before its request arrived");
  v1::GenerateRequest request;
  if (absl::Status status = ParseMessage(buffer, &request); !status.ok()) return status;
  auto prepared = ValidateGenerateRequest(request, *options_.tokenizer, options_.limits);
  if (!prepared.ok()) return prepared.status();
  prepared->arrival = Clock::now();
  if (std::optional<Clock::time_point> deadline = SteadyDeadline(*context, prepared->arrival)) {
    prepared->deadline = *deadline;
  }
  return prepared;
}

absl::StatusOr<GenerationRequest> GenerationService::AdmitGenerate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer& request,
    const char* method) const {
  const auto& metadata = context->client_metadata();
  const auto sent_id = metadata.find(std::string(kRequestIdHeader));
  std::string request_id = AcceptOrMakeRequestId(
      sent_id == metadata.end() ? std::nullopt
                                : std::optional<std::string_view>(std::string_view(
                                      sent_id->second.data(), sent_id->second.size())));
  context->AddInitialMetadata(std::string(kRequestIdHeader), request_id);
  absl::StatusOr<GenerationRequest> prepared;
  if (grpc::Status status = Admit(context); !status.ok()) {
    prepared =
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  } else {
    prepared = Prepare(context, request);
  }
  if (!prepared.ok()) {
    AccessRecord record;
    record.request_id = std::move(request_id);
    record.protocol = "grpc";
    record.method = method;
    record.peer = context->peer();
    record.status = RejectionSeenByClient(*context, prepared.status().code());
    FinishCall(record);
    return prepared.status();
  }
  prepared->origin = {.request_id = std::move(request_id), .protocol = "grpc"};
  return prepared;
}

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  auto prepared = AdmitGenerate(context, *request, "Generate");
  if (!prepared.ok()) return new FinishedCall(this, ToGrpcStatus(prepared.status()));
  prepared->stream_interval = 0;  // answered at the end
  return StartUnaryGenerate(this, context, std::move(*prepared), response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto prepared = AdmitGenerate(context, *request, "GenerateStream");
  if (!prepared.ok()) return new FailedStream(this, ToGrpcStatus(prepared.status()));
  prepared->stream_interval = options_.stream_interval;
  return StartStreamingGenerate(this, context, std::move(*prepared));
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request_buffer,
                                                      grpc::ByteBuffer* response_buffer) {
  if (grpc::Status status = Admit(context); !status.ok()) return new FinishedCall(this, status);
  v1::TokenizeRequest request;
  if (absl::Status status = ParseMessage(*request_buffer, &request); !status.ok()) {
    return new FinishedCall(this, ToGrpcStatus(status));
  }
  auto ids = options_.tokenizer->Encode(request.text());
  if (!ids.ok()) return new FinishedCall(this, ToGrpcStatus(ids.status()));
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids->begin(), ids->end());
  *response_buffer = SerializeMessage(response);
  return new FinishedCall(this, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request_buffer,
                                                        grpc::ByteBuffer* response_buffer) {
  if (grpc::Status status = Admit(context); !status.ok()) return new FinishedCall(this, status);
  v1::DetokenizeRequest request;
  if (absl::Status status = ParseMessage(*request_buffer, &request); !status.ok()) {
    return new FinishedCall(this, ToGrpcStatus(status));
  }
  const int vocab = options_.limits.vocab_size;
  for (int i = 0; i < request.token_ids_size(); ++i) {
    const int32_t id = request.token_ids(i);
    if (id < 0 || id >= vocab) {
      return new FinishedCall(
          this, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             absl::StrCat("token_ids: ids[", i, "] = ", id,
                                          " is outside the vocabulary [0, ", vocab, ")")));
    }
  }
  v1::DetokenizeResponse response;
  response.set_text(DecodedText(*options_.tokenizer, request.token_ids()));
  *response_buffer = SerializeMessage(response);
  return new FinishedCall(this, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request_buffer,
                                                          grpc::ByteBuffer* response_buffer) {
  if (grpc::Status status = Admit(context); !status.ok()) return new FinishedCall(this, status);
  v1::GetModelInfoRequest request;
  if (absl::Status status = ParseMessage(*request_buffer, &request); !status.ok()) {
    return new FinishedCall(this, ToGrpcStatus(status));
  }
  v1::ModelInfo response;
  FillModelInfo(*options_.config, options_.model_name, options_.dispatch, options_.device,
                options_.engine->Snapshot(), &response);
  response.set_scheduling_policy(options_.limits.priority_scheduling ? "priority" : "fcfs");
  response.set_server_version(Version());
  response.set_server_revision(Revision());
  *response_buffer = SerializeMessage(response);
  return new FinishedCall(this, grpc::Status::OK);
}

}  // namespace switchserve
