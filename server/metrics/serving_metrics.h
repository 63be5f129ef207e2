// Prometheus metrics of request serving, named like vLLM's and TGI's so their
// users find them: requests by protocol and final status, finish reasons,
// running / waiting requests, KV cache usage, prompt and generated tokens, and
// histograms of prompt and generation length, time to first token, time per
// output token, end-to-end latency, queue time, step duration and tokens per
// step; and the model info gauge (docs/metrics.md lists every series).
//
// The scheduler calls RecordStep once per engine step and the Record*
// request methods once per request event (never per token), so the histogram
// locks prometheus-cpp takes are held once per step or request.
//
// Thread-safe: every method may be called from any thread.
#ifndef SWITCHSERVE_SERVER_METRICS_SERVING_METRICS_H_
#define SWITCHSERVE_SERVER_METRICS_SERVING_METRICS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace switchserve {

// One engine step, as the scheduler saw it.
struct ServingStepSample {
  double duration_seconds = 0;       // wall time of the step (schedule + forward + sample)
  int64_t prefill_tokens = 0;        // prompt tokens computed (recomputed ones included)
  int64_t decode_tokens = 0;         // tokens of running sequences decoded
  int64_t preemptions = 0;           // sequences preempted (recompute) for KV blocks in this step
  int64_t priority_preemptions = 0;  // ... for a waiting request of a higher priority
  // Prefix caching: tokens of the admitted sequences looked up, and found.
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
};

// The protocols a request can arrive by (the `protocol` label).
enum class RequestProtocol { kGrpc, kHttp };

// "grpc" / "http"; nullopt for any other text.
std::optional<RequestProtocol> ParseRequestProtocol(std::string_view name);

// Why the engine ended a request (the `reason` label of
// switchserve_request_finish_reason_total).
enum class FinishedBy { kLength, kStop, kEos, kCancelled, kError };

// A request the engine ran that finished, successfully or not: only OK ones
// are observed in the latency histograms. (The call or HTTP request it
// belongs to is counted by its front end, RecordRequest, with the status its
// client sees, which a write failing after the engine's end can change.)
struct FinishedRequestSample {
  absl::StatusCode status = absl::StatusCode::kOk;
  double e2e_seconds = 0;  // arrival to the last response
  // From the first to the last generated token (for time per output token);
  // ignored unless generated_tokens >= 2.
  double decode_seconds = 0;
  // Tokens generated for the request (counted in
  // switchserve_generation_tokens_total whatever the status).
  int64_t generated_tokens = 0;
};

class ServingMetrics {
 public:
  // Registers every series in `registry`, counters at zero. `registry` must
  // outlive this object.
  explicit ServingMetrics(prometheus::Registry& registry);

  ServingMetrics(const ServingMetrics&) = delete;
  ServingMetrics& operator=(const ServingMetrics&) = delete;

  void RecordStep(const ServingStepSample& step);
  // A request left the queue for its first step, `seconds` after arrival.
  void RecordQueueTime(double seconds);
  // A request's first token was produced, `seconds` after arrival.
  void RecordFirstToken(double seconds);
  // A request the engine ran ended without a first token, `seconds` after
  // arrival (cancelled, past its deadline, refused by the drain or failed).
  void RecordEndedWithoutFirstToken(double seconds);
  void RecordFinished(const FinishedRequestSample& request);
  // A gRPC call or HTTP request ended with `status`, as its client sees it
  // (switchserve_requests_total): counted once by its front end, whatever
  // its number of prompts, and whether or not the engine ran it.
  void RecordRequest(RequestProtocol protocol, absl::StatusCode status);
  // A request the engine ran ended: why, and how long its prompt and
  // generation were (requests rejected before the engine are not counted).
  void RecordEngineFinished(FinishedBy reason, int64_t prompt_tokens, int64_t generated_tokens);
  // The engine's state whenever it changes, after each step and between
  // steps (requests cancelled or past their deadline while it is idle): the
  // one setter of the running and waiting gauges and the KV cache's usage.
  void SetEngineState(int64_t running, int64_t waiting, double kv_cache_usage_ratio);
  // An HTTP connection was closed as it was accepted: the open ones had
  // reached --http-max-connections.
  void RecordHttpConnectionRefused();

  // The status codes that have their own series; any other code counts as
  // UNKNOWN.
  static constexpr std::array<RequestProtocol, 2> kProtocols = {RequestProtocol::kGrpc,
                                                                RequestProtocol::kHttp};
  static constexpr std::array<FinishedBy, 5> kFinishReasons = {
      FinishedBy::kLength, FinishedBy::kStop, FinishedBy::kEos, FinishedBy::kCancelled,
      FinishedBy::kError};
  static constexpr std::array<absl::StatusCode, 11> kStatusCodes = {
      absl::StatusCode::kOk,
      absl::StatusCode::kCancelled,
      absl::StatusCode::kDeadlineExceeded,
      absl::StatusCode::kInvalidArgument,
      absl::StatusCode::kNotFound,
      absl::StatusCode::kResourceExhausted,
      absl::StatusCode::kUnavailable,
      absl::StatusCode::kUnauthenticated,
      absl::StatusCode::kFailedPrecondition,
      absl::StatusCode::kInternal,
      absl::StatusCode::kUnknown,  // last: every other code counts here
  };

 private:
  // [protocol][status]
  std::array<std::array<prometheus::Counter*, kStatusCodes.size()>, kProtocols.size()> requests_{};
  std::array<prometheus::Counter*, kFinishReasons.size()> finish_reasons_{};
  prometheus::Histogram* prompt_length_ = nullptr;
  prometheus::Histogram* generation_length_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Counter* priority_preemptions_ = nullptr;
  prometheus::Counter* prefix_query_tokens_ = nullptr;
  prometheus::Counter* prefix_hit_tokens_ = nullptr;
  prometheus::Counter* http_connections_refused_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* no_first_token_ = nullptr;
  prometheus::Histogram* tpot_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Histogram* step_tokens_ = nullptr;
};

// What `switchserve_model_info` says about the served model: a gauge at 1
// whose labels carry the facts (like vLLM's cache_config_info), so queries
// can join on them.
struct ModelInfoLabels {
  std::string model;         // the served model name
  std::string device;        // the backend's name(): "cpu", "cuda"
  std::string architecture;  // "switchall", "switchhead", "switch", "dense"
  std::string tokenizer;     // "byte", "sentencepiece"
  int context_length = 0;
  std::string kv_cache_dtype;  // the cache's element type: "f32", "bf16"
};
void RegisterModelInfo(prometheus::Registry& registry, const ModelInfoLabels& info);

// `switchserve_build_info`: a gauge at 1 whose labels are the server's
// release and source revision (server/version.h), as Prometheus's own
// prometheus_build_info, so that dashboards and alerts can tell which
// build each replica runs.
void RegisterBuildInfo(prometheus::Registry& registry, const std::string& version,
                       const std::string& revision);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_SERVING_METRICS_H_
