#include "server/metrics/serving_metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "prometheus/text_serializer.h"
#include "server/metrics/engine_metrics_observer.h"
#include "server/metrics/output_buffer_metrics.h"
#include "server/metrics/process_metrics.h"
#include "tests/metrics/registry_reader.h"
#include "tests/metrics/synthetic_routing.h"

namespace switchserve {
namespace {

using testing::RegistryReader;

const prometheus::ClientMetric::Histogram& HistogramOf(const RegistryReader& reader,
                                                       const std::string& name) {
  const auto* metric = reader.Series(name, {});
  EXPECT_NE(metric, nullptr) << name;
  static const prometheus::ClientMetric::Histogram empty;
  return metric == nullptr ? empty : metric->histogram;
}

TEST(ServingMetricsTest, EveryProtocolStatusAndFinishReasonHasASeriesAtZero) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  RegistryReader reader(registry);
  for (const char* protocol : {"grpc", "http"}) {
    for (const char* status : {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT",
                               "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "UNAUTHENTICATED",
                               "FAILED_PRECONDITION", "INTERNAL", "UNKNOWN"}) {
      EXPECT_EQ(reader.Counter("switchserve_requests_total",
                               {{"protocol", protocol}, {"status", status}}),
                0.0)
          << protocol << " " << status;
    }
  }
  for (const char* reason : {"length", "stop", "eos", "cancelled", "error"}) {
    EXPECT_EQ(reader.Counter("switchserve_request_finish_reason_total", {{"reason", reason}}), 0.0)
        << reason;
  }
  EXPECT_EQ(reader.Gauge("switchserve_requests_waiting", {}), 0.0);
  EXPECT_EQ(reader.AllExposedSeries(), 186u);  // docs/metrics.md
}

TEST(ServingMetricsTest, EngineFinishedRequestsCountReasonsAndLengths) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  metrics.RecordEngineFinished(FinishedBy::kLength, 7, 16);
  metrics.RecordEngineFinished(FinishedBy::kStop, 120, 3);
  metrics.RecordEngineFinished(FinishedBy::kStop, 1, 0);
  RegistryReader reader(registry);
  EXPECT_EQ(reader.Counter("switchserve_request_finish_reason_total", {{"reason", "length"}}), 1.0);
  EXPECT_EQ(reader.Counter("switchserve_request_finish_reason_total", {{"reason", "stop"}}), 2.0);
  EXPECT_EQ(reader.Counter("switchserve_request_finish_reason_total", {{"reason", "eos"}}), 0.0);
  const auto& prompt = HistogramOf(reader, "switchserve_request_prompt_tokens");
  EXPECT_EQ(prompt.sample_count, 3u);
  EXPECT_EQ(prompt.sample_sum, 128.0);
  // 7 lies in (5, 10], 120 in (100, 200], 1 in [0, 1].
  for (const auto& bucket : prompt.bucket) {
    const uint64_t want =
        (bucket.upper_bound >= 1) + (bucket.upper_bound >= 7) + (bucket.upper_bound >= 120);
    EXPECT_EQ(bucket.cumulative_count, want) << bucket.upper_bound;
  }
  const auto& generation = HistogramOf(reader, "switchserve_request_generation_tokens");
  EXPECT_EQ(generation.sample_count, 3u);
  EXPECT_EQ(generation.sample_sum, 19.0);
}

TEST(ServingMetricsTest, ModelInfoIsOneWithTheModelInItsLabels) {
  prometheus::Registry registry;
  RegisterModelInfo(registry, {.model = "bible",
                               .device = "cpu",
                               .architecture = "switchall",
                               .tokenizer = "byte",
                               .context_length = 256,
                               .kv_cache_dtype = "bf16"});
  RegistryReader reader(registry);
  EXPECT_EQ(reader.Gauge("switchserve_model_info", {{"model", "bible"},
                                                    {"device", "cpu"},
                                                    {"architecture", "switchall"},
                                                    {"tokenizer", "byte"},
                                                    {"context_length", "256"},
                                                    {"kv_cache_dtype", "bf16"}}),
            1.0);
  EXPECT_EQ(reader.AllExposedSeries(), 1u);
}

TEST(ServingMetricsTest, BuildInfoIsOneWithTheReleaseAndRevisionInItsLabels) {
  prometheus::Registry registry;
  RegisterBuildInfo(registry, "1.2.3", "0123456789ab-dirty");
  RegistryReader reader(registry);
  EXPECT_EQ(reader.Gauge("switchserve_build_info",
                         {{"version", "1.2.3"}, {"revision", "0123456789ab-dirty"}}),
            1.0);
  EXPECT_EQ(reader.AllExposedSeries(), 1u);
}

TEST(ServingMetricsTest, StepsCountTokensAndTheEngineStateSetsTheGauges) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  metrics.RecordStep(
      {.duration_seconds = 0.02, .prefill_tokens = 100, .decode_tokens = 3, .preemptions = 1});
  metrics.RecordStep({.duration_seconds = 0.001, .priority_preemptions = 2});
  metrics.SetEngineState(5, 7, 0.25);
  metrics.RecordStep({.duration_seconds = 0.004, .prefill_tokens = 0, .decode_tokens = 5});
  metrics.SetEngineState(4, 2, 0.5);
  RegistryReader reader(registry);
  EXPECT_EQ(reader.Counter("switchserve_prompt_tokens_total", {}), 100.0);
  EXPECT_EQ(reader.Counter("switchserve_preemptions_total", {}), 1.0);
  EXPECT_EQ(reader.Counter("switchserve_priority_preemptions_total", {}), 2.0);
  EXPECT_EQ(reader.Gauge("switchserve_requests_running", {}), 4.0);
  EXPECT_EQ(reader.Gauge("switchserve_requests_waiting", {}), 2.0);
  EXPECT_EQ(reader.Gauge("switchserve_kv_cache_usage_ratio", {}), 0.5);
  const auto& duration = HistogramOf(reader, "switchserve_step_duration_seconds");
  EXPECT_EQ(duration.sample_count, 3u);
  EXPECT_NEAR(duration.sample_sum, 0.025, 1e-12);
  const auto& tokens = HistogramOf(reader, "switchserve_step_tokens");
  EXPECT_EQ(tokens.sample_count, 3u);
  EXPECT_EQ(tokens.sample_sum, 108.0);
}

TEST(ServingMetricsTest, RequestsCountByProtocolAndStatusAndOnlyOkOnesAreTimed) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  metrics.RecordQueueTime(0.003);
  metrics.RecordFirstToken(0.2);
  metrics.RecordRequest(RequestProtocol::kGrpc, absl::StatusCode::kOk);
  metrics.RecordFinished({.status = absl::StatusCode::kOk,
                          .e2e_seconds = 1.2,
                          .decode_seconds = 1.0,
                          .generated_tokens = 11});
  metrics.RecordRequest(RequestProtocol::kHttp, absl::StatusCode::kResourceExhausted);
  metrics.RecordFinished({.status = absl::StatusCode::kResourceExhausted, .e2e_seconds = 0.001});
  metrics.RecordRequest(RequestProtocol::kGrpc, absl::StatusCode::kDataLoss);  // as UNKNOWN
  metrics.RecordFinished({.status = absl::StatusCode::kDataLoss});
  RegistryReader reader(registry);
  using Labels = testing::LabelMap;
  EXPECT_EQ(
      reader.Counter("switchserve_requests_total", Labels{{"protocol", "grpc"}, {"status", "OK"}}),
      1.0);
  EXPECT_EQ(reader.Counter("switchserve_requests_total",
                           Labels{{"protocol", "http"}, {"status", "RESOURCE_EXHAUSTED"}}),
            1.0);
  EXPECT_EQ(reader.Counter("switchserve_requests_total",
                           Labels{{"protocol", "grpc"}, {"status", "RESOURCE_EXHAUSTED"}}),
            0.0);
  EXPECT_EQ(reader.Counter("switchserve_requests_total",
                           Labels{{"protocol", "grpc"}, {"status", "UNKNOWN"}}),
            1.0);
  EXPECT_EQ(reader.Counter("switchserve_generation_tokens_total", {}), 11.0);
  const auto& e2e = HistogramOf(reader, "switchserve_e2e_request_latency_seconds");
  EXPECT_EQ(e2e.sample_count, 1u);
  EXPECT_EQ(e2e.sample_sum, 1.2);
  const auto& tpot = HistogramOf(reader, "switchserve_time_per_output_token_seconds");
  EXPECT_EQ(tpot.sample_count, 1u);
  EXPECT_NEAR(tpot.sample_sum, 0.1, 1e-12);
  // 0.1 lies in the le=0.1 bucket (upper bounds are inclusive).
  for (const auto& bucket : tpot.bucket) {
    EXPECT_EQ(bucket.cumulative_count, bucket.upper_bound >= 0.1 ? 1u : 0u) << bucket.upper_bound;
  }
  EXPECT_EQ(HistogramOf(reader, "switchserve_time_to_first_token_seconds").sample_count, 1u);
  EXPECT_EQ(HistogramOf(reader, "switchserve_request_queue_time_seconds").sample_count, 1u);
}

// The engine's observer counts why the engine ended each request, and times
// the served ones; the calls themselves are counted by their front ends, with
// the status their clients see (a write failing after the engine's end turns
// an OK into CANCELLED or DEADLINE_EXCEEDED), never here.
TEST(EngineMetricsObserverTest, CountsWhyTheEngineEndedRequestsButNoCalls) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  EngineMetricsObserver observer(&metrics, nullptr, 16);
  GenerationRequest request;
  request.origin.protocol = "grpc";
  for (const CancelCause cause :
       {CancelCause::kClient, CancelCause::kDeadline, CancelCause::kShutdown}) {
    GenerationUpdate update;
    update.finished = true;
    update.finish_reason = FinishReason::kCancelled;
    update.cancel_cause = cause;
    update.total_ms = 5;
    observer.OnRequestFinished(request, update);
  }
  GenerationUpdate done;
  done.finished = true;
  done.finish_reason = FinishReason::kLength;
  done.total_ms = 7;
  observer.OnRequestFinished(request, done);
  RegistryReader reader(registry);
  for (const char* status : {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}) {
    EXPECT_EQ(
        reader.Counter("switchserve_requests_total", {{"protocol", "grpc"}, {"status", status}}),
        0.0)
        << status;
  }
  EXPECT_EQ(reader.Counter("switchserve_request_finish_reason_total", {{"reason", "cancelled"}}),
            3.0);
  EXPECT_EQ(reader.Counter("switchserve_request_finish_reason_total", {{"reason", "length"}}), 1.0);
  const auto& e2e = HistogramOf(reader, "switchserve_e2e_request_latency_seconds");
  EXPECT_EQ(e2e.sample_count, 1u);
  EXPECT_DOUBLE_EQ(e2e.sample_sum, 0.007);
}

// A request's first-token latency is recorded as the token comes (it must
// reach the SLO's windows before a long generation ends); a request that ends
// without one is recorded at its end, in its own histogram, so that the SLO
// can leave out those that ended within the threshold (a client cancelling
// at once was counted as a miss).
TEST(EngineMetricsObserverTest, FirstTokensAsTheyComeAndRequestsWithoutOneAtTheirEnd) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  EngineMetricsObserver observer(&metrics, nullptr, 16);
  GenerationRequest request;
  request.origin.protocol = "http";
  observer.OnFirstToken(request, 0.02, 0.3);
  RegistryReader at_first_token(registry);
  EXPECT_EQ(HistogramOf(at_first_token, "switchserve_time_to_first_token_seconds").sample_count,
            1u);
  EXPECT_EQ(HistogramOf(at_first_token, "switchserve_time_to_first_token_seconds").sample_sum, 0.3);
  EXPECT_EQ(HistogramOf(at_first_token, "switchserve_request_queue_time_seconds").sample_sum, 0.02);
  GenerationUpdate served;
  served.finished = true;
  served.finish_reason = FinishReason::kLength;
  served.completion_tokens = 5;
  served.queue_ms = 20;
  served.time_to_first_token_ms = 300;
  observer.OnRequestFinished(request, served);  // not counted twice
  GenerationUpdate gone;
  gone.finished = true;
  gone.finish_reason = FinishReason::kCancelled;
  gone.cancel_cause = CancelCause::kClient;
  gone.queue_ms = 100;
  gone.total_ms = 100;
  observer.OnRequestFinished(request, gone);
  RegistryReader reader(registry);
  EXPECT_EQ(HistogramOf(reader, "switchserve_time_to_first_token_seconds").sample_count, 1u);
  EXPECT_EQ(HistogramOf(reader, "switchserve_request_queue_time_seconds").sample_count, 2u);
  const auto& without = HistogramOf(reader, "switchserve_time_to_end_without_first_token_seconds");
  EXPECT_EQ(without.sample_count, 1u);
  EXPECT_EQ(without.sample_sum, 0.1);
  // The server's warm-up (no protocol) is in no metric.
  observer.OnFirstToken(GenerationRequest(), 0.1, 0.1);
  RegistryReader after_warm_up(registry);
  EXPECT_EQ(HistogramOf(after_warm_up, "switchserve_time_to_first_token_seconds").sample_count, 1u);
}

// A step whose routing statistics do not fit the model's routers (a backend
// and model that disagree) is left out of the MoE metrics, with one warning
// for however many such steps; the step's serving figures still count.
TEST(EngineMetricsObserverTest, RoutingThatDoesNotFitIsLeftOutAndSaidOnce) {
  testing::SyntheticRouting model_routing(testing::SmallSwitchAllConfig(2), /*seed=*/1, 1.0);
  testing::SyntheticRouting other_routing(testing::SmallSwitchAllConfig(3), /*seed=*/1, 1.0);
  MoeMetrics moe(model_routing.routers());
  prometheus::Registry registry;
  ServingMetrics serving(registry);
  EngineMetricsObserver observer(&serving, &moe, 16);
  const StepRoutingStats misfit = other_routing.Step(8, DispatchConfig{});
  StepReport report;
  report.decode_tokens = 8;
  report.routing = &misfit;
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) observer.OnStep(report);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string warning = "MoE metrics leave out a step whose routing statistics";
  const size_t first = log.find(warning);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(warning, first + 1), std::string::npos) << log;
  EXPECT_EQ(HistogramOf(RegistryReader(registry), "switchserve_step_tokens").sample_count, 3u);
  RegistryReader moe_reader(moe);
  const RouterId& router = model_routing.routers().front();
  EXPECT_EQ(moe_reader.Counter("switchserve_moe_router_tokens_total",
                               {{"layer", std::to_string(router.layer)},
                                {"module", std::string(ToString(router.module))},
                                {"head", std::to_string(router.head)}}),
            0.0);
}

// The alert rules and dashboard select buckets by their `le` text, e.g.
// le="1" for the one-second TTFT objective: pin what the serializer writes.
TEST(ServingMetricsTest, BucketBoundsSerializeAsAlertRulesExpect) {
  prometheus::Registry registry;
  ServingMetrics metrics(registry);
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_NE(text.find("switchserve_time_to_first_token_seconds_bucket{le=\"1\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("switchserve_e2e_request_latency_seconds_bucket{le=\"10\"}"),
            std::string::npos);
  EXPECT_NE(text.find("switchserve_time_per_output_token_seconds_bucket{le=\"0.1\"}"),
            std::string::npos);
}

TEST(ProcessMetricsTest, ReadsThisProcess) {
  ProcessMetrics process;
  std::map<std::string, double> values;
  for (const auto& family : process.Collect()) {
    ASSERT_EQ(family.metric.size(), 1u);
    values[family.name] = family.type == prometheus::MetricType::Counter
                              ? family.metric[0].counter.value
                              : family.metric[0].gauge.value;
  }
  EXPECT_EQ(values.size(), 7u);
  EXPECT_GT(values["process_resident_memory_bytes"], 1e5);
  EXPECT_GE(values["process_virtual_memory_bytes"], values["process_resident_memory_bytes"]);
  EXPECT_GE(values["process_threads"], 1.0);
  EXPECT_GE(values["process_open_fds"], 3.0);
  EXPECT_GT(values["process_max_fds"], 0.0);
  EXPECT_GE(values["process_cpu_seconds_total"], 0.0);
  EXPECT_GT(values["process_start_time_seconds"], 1.5e9);  // after 2017
}

TEST(OutputBufferMetricsTest, ReadsWhatIsHeldAtEachScrapeAndTheLimit) {
  std::atomic<int64_t> held{0};
  OutputBufferMetrics metrics([&held] { return held.load(); }, 4096);
  const auto values = [&metrics] {
    std::map<std::string, double> out;
    for (const auto& family : metrics.Collect()) {
      EXPECT_EQ(family.type, prometheus::MetricType::Gauge) << family.name;
      EXPECT_EQ(family.metric.size(), 1u) << family.name;
      out[family.name] = family.metric[0].gauge.value;
    }
    return out;
  };
  EXPECT_EQ(values(),
            (std::map<std::string, double>{{"switchserve_output_buffer_bytes", 0.0},
                                           {"switchserve_output_buffer_limit_bytes", 4096.0}}));
  held = 1500;
  EXPECT_EQ(values()["switchserve_output_buffer_bytes"], 1500.0);
  held = 0;
  EXPECT_EQ(values()["switchserve_output_buffer_bytes"], 0.0);
}

}  // namespace
}  // namespace switchserve
