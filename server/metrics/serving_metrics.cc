#include "server/metrics/serving_metrics.h"

#include <string>

#include "prometheus/family.h"

namespace switchserve {
namespace {

using prometheus::Histogram;

Histogram& NewHistogram(prometheus::Registry& registry, const char* name, const char* help,
                        Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, std::move(buckets));
}

prometheus::Counter& NewCounter(prometheus::Registry& registry, const char* name,
                                const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Gauge& NewGauge(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

const char* ProtocolName(RequestProtocol protocol) {
  return protocol == RequestProtocol::kHttp ? "http" : "grpc";
}

const char* FinishedByName(FinishedBy reason) {
  switch (reason) {
    case FinishedBy::kLength:
      return "length";
    case FinishedBy::kStop:
      return "stop";
    case FinishedBy::kEos:
      return "eos";
    case FinishedBy::kCancelled:
      return "cancelled";
    case FinishedBy::kError:
      return "error";
  }
  return "error";
}

// Seconds to a first token, and to the end of a request without one: the
// SLO's threshold (1 s) is a bound of both.
Histogram::BucketBoundaries FirstTokenBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

// 1, 2, 5, 10, 20, 50, ... 100000: token counts of prompts and generations.
Histogram::BucketBoundaries LengthBuckets() {
  Histogram::BucketBoundaries buckets;
  for (double decade = 1; decade <= 1e5; decade *= 10) {
    for (double step : {1.0, 2.0, 5.0}) {
      if (decade * step <= 1e5) buckets.push_back(decade * step);
    }
  }
  return buckets;
}

}  // namespace

std::optional<RequestProtocol> ParseRequestProtocol(std::string_view name) {
  if (name == "grpc") return RequestProtocol::kGrpc;
  if (name == "http") return RequestProtocol::kHttp;
  return std::nullopt;
}

ServingMetrics::ServingMetrics(prometheus::Registry& registry) {
  auto& requests = prometheus::BuildCounter()
                       .Name("switchserve_requests_total")
                       .Help(
                           "Finished requests by protocol and final status code (gRPC's "
                           "canonical codes, for HTTP requests too).")
                       .Register(registry);
  for (size_t p = 0; p < kProtocols.size(); ++p) {
    for (size_t i = 0; i < kStatusCodes.size(); ++i) {
      requests_[p][i] = &requests.Add({{"protocol", ProtocolName(kProtocols[p])},
                                       {"status", absl::StatusCodeToString(kStatusCodes[i])}});
    }
  }
  auto& reasons = prometheus::BuildCounter()
                      .Name("switchserve_request_finish_reason_total")
                      .Help(
                          "Requests the engine ended, by why: length, stop (a stop string "
                          "or stop token), eos, cancelled (client, deadline or shutdown), "
                          "error.")
                      .Register(registry);
  for (size_t i = 0; i < kFinishReasons.size(); ++i) {
    finish_reasons_[i] = &reasons.Add({{"reason", FinishedByName(kFinishReasons[i])}});
  }
  prompt_length_ =
      &NewHistogram(registry, "switchserve_request_prompt_tokens",
                    "Prompt length of each request the engine ran, in tokens.", LengthBuckets());
  generation_length_ =
      &NewHistogram(registry, "switchserve_request_generation_tokens",
                    "Tokens generated for each request the engine ran.", LengthBuckets());
  prompt_tokens_ = &NewCounter(registry, "switchserve_prompt_tokens_total",
                               "Prompt tokens prefilled (recomputed ones after a preemption "
                               "count again).");
  generation_tokens_ = &NewCounter(registry, "switchserve_generation_tokens_total",
                                   "Tokens generated, counted when their request finishes.");
  preemptions_ = &NewCounter(registry, "switchserve_preemptions_total",
                             "Sequences preempted (recompute) because KV blocks ran out.");
  priority_preemptions_ =
      &NewCounter(registry, "switchserve_priority_preemptions_total",
                  "Sequences preempted (recompute) for a waiting request of a higher priority "
                  "(--scheduling-policy priority).");
  prefix_query_tokens_ = &NewCounter(
      registry, "switchserve_prefix_cache_query_tokens_total",
      "Tokens of the requests admitted while prefix caching is on (--enable-prefix-caching), "
      "each looked up in the cache when admitted (again after a preemption).");
  prefix_hit_tokens_ =
      &NewCounter(registry, "switchserve_prefix_cache_hit_tokens_total",
                  "Of switchserve_prefix_cache_query_tokens_total, those whose K and V were in "
                  "the cache: not computed (not in switchserve_prompt_tokens_total) and not "
                  "routed (not in the MoE metrics).");
  http_connections_refused_ =
      &NewCounter(registry, "switchserve_http_connections_refused_total",
                  "HTTP API connections closed as they were accepted, because "
                  "--http-max-connections were open.");
  running_ = &NewGauge(registry, "switchserve_requests_running",
                       "Requests with a sequence in the running batch.");
  waiting_ = &NewGauge(registry, "switchserve_requests_waiting",
                       "Requests queued, waiting to be scheduled (preempted ones included).");
  kv_usage_ = &NewGauge(registry, "switchserve_kv_cache_usage_ratio",
                        "Share of KV cache blocks in use (0..1).");
  ttft_ =
      &NewHistogram(registry, "switchserve_time_to_first_token_seconds",
                    "Time from request arrival to its first generated token.", FirstTokenBuckets());
  no_first_token_ =
      &NewHistogram(registry, "switchserve_time_to_end_without_first_token_seconds",
                    "Time from arrival to the end of requests that ended without a first token "
                    "(cancelled, past their deadline, refused by the drain, failed).",
                    FirstTokenBuckets());
  tpot_ = &NewHistogram(registry, "switchserve_time_per_output_token_seconds",
                        "Mean time between generated tokens of a request, after the first.",
                        {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
  e2e_ = &NewHistogram(registry, "switchserve_e2e_request_latency_seconds",
                       "Time from request arrival to its last response.",
                       {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
  queue_ = &NewHistogram(registry, "switchserve_request_queue_time_seconds",
                         "Time from request arrival to its first scheduled step.",
                         {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  step_duration_ =
      &NewHistogram(registry, "switchserve_step_duration_seconds", "Wall time of one engine step.",
                    {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5});
  step_tokens_ = &NewHistogram(registry, "switchserve_step_tokens",
                               "Tokens (prefill + decode) computed in one engine step.",
                               {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192});
}

void ServingMetrics::RecordStep(const ServingStepSample& step) {
  step_duration_->Observe(step.duration_seconds);
  step_tokens_->Observe(static_cast<double>(step.prefill_tokens + step.decode_tokens));
  if (step.prefill_tokens > 0) prompt_tokens_->Increment(static_cast<double>(step.prefill_tokens));
  if (step.preemptions > 0) preemptions_->Increment(static_cast<double>(step.preemptions));
  if (step.priority_preemptions > 0) {
    priority_preemptions_->Increment(static_cast<double>(step.priority_preemptions));
  }
  if (step.prefix_query_tokens > 0) {
    prefix_query_tokens_->Increment(static_cast<double>(step.prefix_query_tokens));
  }
  if (step.prefix_hit_tokens > 0) {
    prefix_hit_tokens_->Increment(static_cast<double>(step.prefix_hit_tokens));
  }
}

void ServingMetrics::RecordHttpConnectionRefused() { http_connections_refused_->Increment(); }

void ServingMetrics::RecordQueueTime(double seconds) { queue_->Observe(seconds); }

void ServingMetrics::RecordFirstToken(double seconds) { ttft_->Observe(seconds); }

void ServingMetrics::RecordEndedWithoutFirstToken(double seconds) {
  no_first_token_->Observe(seconds);
}

void ServingMetrics::RecordRequest(RequestProtocol protocol, absl::StatusCode status) {
  size_t index = kStatusCodes.size() - 1;  // UNKNOWN
  for (size_t i = 0; i < kStatusCodes.size(); ++i) {
    if (kStatusCodes[i] == status) index = i;
  }
  requests_[protocol == RequestProtocol::kHttp ? 1 : 0][index]->Increment();
}

void ServingMetrics::RecordFinished(const FinishedRequestSample& request) {
  if (request.generated_tokens > 0) {
    generation_tokens_->Increment(static_cast<double>(request.generated_tokens));
  }
  // Latency histograms describe served requests; rejections and failures
  // would pull the percentiles down.
  if (request.status != absl::StatusCode::kOk) return;
  e2e_->Observe(request.e2e_seconds);
  if (request.generated_tokens >= 2) {
    tpot_->Observe(request.decode_seconds / static_cast<double>(request.generated_tokens - 1));
  }
}

void ServingMetrics::RecordEngineFinished(FinishedBy reason, int64_t prompt_tokens,
                                          int64_t generated_tokens) {
  for (size_t i = 0; i < kFinishReasons.size(); ++i) {
    if (kFinishReasons[i] == reason) finish_reasons_[i]->Increment();
  }
  prompt_length_->Observe(static_cast<double>(prompt_tokens));
  generation_length_->Observe(static_cast<double>(generated_tokens));
}

void ServingMetrics::SetEngineState(int64_t running, int64_t waiting, double kv_cache_usage_ratio) {
  running_->Set(static_cast<double>(running));
  waiting_->Set(static_cast<double>(waiting));
  kv_usage_->Set(kv_cache_usage_ratio);
}

void RegisterModelInfo(prometheus::Registry& registry, const ModelInfoLabels& info) {
  prometheus::BuildGauge()
      .Name("switchserve_model_info")
      .Help("The served model (always 1; the labels say which model, on which device).")
      .Register(registry)
      .Add({{"model", info.model},
            {"device", info.device},
            {"architecture", info.architecture},
            {"tokenizer", info.tokenizer},
            {"context_length", std::to_string(info.context_length)},
            {"kv_cache_dtype", info.kv_cache_dtype}})
      .Set(1);
}

void RegisterBuildInfo(prometheus::Registry& registry, const std::string& version,
                       const std::string& revision) {
  prometheus::BuildGauge()
      .Name("switchserve_build_info")
      .Help("The server's build (always 1; the labels say which release and source revision).")
      .Register(registry)
      .Add({{"version", version}, {"revision", revision}})
      .Set(1);
}

}  // namespace switchserve
