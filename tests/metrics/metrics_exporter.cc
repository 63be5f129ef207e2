// A test exporter: the real MoeMetrics, ServingMetrics and MetricsExposer fed
// by synthetic engine steps (the engine's routing and capacity dispatch on
// random router logits) and a simulated request scheduler, so the dashboard,
// the alert rules and the counters can be checked against a real Prometheus
// without a model server (tests/metrics/test_prometheus.py).
//
//   --mode=load       steps every --step_ms with simulated requests, until killed
//   --mode=commanded  idle until a stdin line "run STEPS TOKENS", then runs
//                     them and prints one JSON line with the engine's totals
//   --mode=bench      times the per-step metric updates and a scrape's
//                     serialisation for a model of the paper's shape
#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "engine/moe/routing_stats.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/metrics_exposer.h"
#include "server/metrics/moe_metrics.h"
#include "server/metrics/output_buffer_metrics.h"
#include "server/metrics/serving_metrics.h"
#include "server/version.h"
#include "tests/metrics/synthetic_routing.h"

ABSL_FLAG(std::string, mode, "load", "load, commanded or bench");
ABSL_FLAG(std::string, host, "127.0.0.1", "metrics listen address");
ABSL_FLAG(int, port, 0, "metrics port (0: any free port, printed on stdout)");
ABSL_FLAG(std::string, model, "small", "small (2 layers) or paper (18 layers, E=4 heads, 32 FFN)");
ABSL_FLAG(double, capacity_factor, 0.0, "expert capacity factor; <= 0 is dropless");
ABSL_FLAG(std::string, overflow, "drop", "drop or reroute");
ABSL_FLAG(double, skew, 0.0, "logit bias toward expert 0 in layer 0 (collapse)");
ABSL_FLAG(int, seed, 1, "random seed");
ABSL_FLAG(bool, moe_metrics, true, "record MoE metrics");
ABSL_FLAG(int, step_ms, 10, "load: simulated compute time per step");
ABSL_FLAG(double, arrivals_per_step, 0.6, "load: mean request arrivals per step");
ABSL_FLAG(int, max_running, 32, "load: running requests at most");
ABSL_FLAG(int, bench_steps, 2000, "bench: steps to time");
ABSL_FLAG(int, bench_tokens, 32, "bench: tokens per step (32 decoding clients)");

namespace switchserve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A FCFS scheduler over simulated requests: each step admits waiting
// requests up to max_running, prefills their prompts, decodes one token for
// every running request, and finishes requests at their target length (or
// cancels one now and then). It reports what a real scheduler would.
class SimulatedScheduler {
 public:
  SimulatedScheduler(ServingMetrics* serving, uint32_t seed, double arrivals_per_step,
                     int max_running)
      : serving_(serving), rng_(seed), arrivals_(arrivals_per_step), max_running_(max_running) {}

  // Plans one step; returns its token count (prefill + decode).
  int64_t Plan(Clock::time_point now) {
    const int arrivals = arrivals_(rng_);
    for (int i = 0; i < arrivals; ++i) {
      if (waiting_.size() >= 64) {
        serving_->RecordRequest(RequestProtocol::kGrpc, absl::StatusCode::kResourceExhausted);
        continue;
      }
      waiting_.push_back({.arrival = now,
                          .prompt_tokens = std::uniform_int_distribution<int>(8, 96)(rng_),
                          .target_tokens = std::uniform_int_distribution<int>(4, 64)(rng_)});
    }
    prefill_ = 0;
    decode_ = static_cast<int64_t>(running_.size());
    while (!waiting_.empty() && static_cast<int>(running_.size()) < max_running_) {
      Request request = waiting_.front();
      waiting_.pop_front();
      serving_->RecordQueueTime(Seconds(now - request.arrival));
      prefill_ += request.prompt_tokens;
      running_.push_back(request);
    }
    return prefill_ + decode_;
  }

  // Completes the planned step, which started at `start`.
  void Finish(Clock::time_point start) {
    const Clock::time_point now = Clock::now();
    std::deque<Request> still_running;
    int64_t kv_tokens = 0;
    for (Request& request : running_) {
      if (++request.generated == 1) {
        request.first_token = now;
        serving_->RecordFirstToken(Seconds(now - request.arrival));
      }
      const bool cancelled = std::uniform_int_distribution<int>(0, 399)(rng_) == 0;
      if (cancelled || request.generated >= request.target_tokens) {
        // Every third request comes over HTTP; the stop reasons alternate.
        const absl::StatusCode status =
            cancelled ? absl::StatusCode::kCancelled : absl::StatusCode::kOk;
        serving_->RecordRequest(
            request.target_tokens % 3 == 0 ? RequestProtocol::kHttp : RequestProtocol::kGrpc,
            status);
        serving_->RecordFinished({.status = status,
                                  .e2e_seconds = Seconds(now - request.arrival),
                                  .decode_seconds = Seconds(now - request.first_token),
                                  .generated_tokens = request.generated});
        serving_->RecordEngineFinished(cancelled                        ? FinishedBy::kCancelled
                                       : request.target_tokens % 2 == 0 ? FinishedBy::kLength
                                                                        : FinishedBy::kStop,
                                       request.prompt_tokens, request.generated);
      } else {
        kv_tokens += request.prompt_tokens + request.generated;
        still_running.push_back(request);
      }
    }
    running_ = std::move(still_running);
    serving_->RecordStep({.duration_seconds = Seconds(now - start),
                          .prefill_tokens = prefill_,
                          .decode_tokens = decode_});
    serving_->SetEngineState(static_cast<int64_t>(running_.size()),
                             static_cast<int64_t>(waiting_.size()),
                             std::min(1.0, static_cast<double>(kv_tokens) / kKvCapacityTokens));
  }

 private:
  static constexpr double kKvCapacityTokens = 4096;
  struct Request {
    Clock::time_point arrival{};
    int prompt_tokens = 0;
    int target_tokens = 0;
    int generated = 0;
    Clock::time_point first_token{};
  };

  ServingMetrics* serving_;
  std::mt19937 rng_;
  std::poisson_distribution<int> arrivals_;
  int max_running_;
  std::deque<Request> waiting_;
  std::deque<Request> running_;
  int64_t prefill_ = 0;
  int64_t decode_ = 0;
};

DispatchConfig DispatchFromFlags() {
  DispatchConfig dispatch;
  dispatch.capacity_factor = absl::GetFlag(FLAGS_capacity_factor);
  dispatch.overflow =
      absl::GetFlag(FLAGS_overflow) == "reroute" ? OverflowPolicy::kReroute : OverflowPolicy::kDrop;
  dispatch.scope = CapacityScope::kStep;  // a synthetic step shares one capacity
  return dispatch;
}

std::string JsonArray(const auto& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    absl::StrAppendFormat(&out, "%s%.17g", i == 0 ? "" : ",", static_cast<double>(values[i]));
  }
  return out + "]";
}

// The engine's totals since start, one JSON object per router.
std::string TotalsJson(const std::vector<RouterId>& routers, const StepRoutingStats& total) {
  std::string out = "{\"routers\":[";
  for (size_t r = 0; r < routers.size(); ++r) {
    const RouterId& id = routers[r];
    const RouterStepStats& s = total.routers[r];
    absl::StrAppendFormat(&out,
                          "%s{\"layer\":\"%d\",\"module\":\"%s\",\"head\":\"%d\",\"tokens\":%d,"
                          "\"routed\":%s,\"dropped\":%s,\"rerouted\":%s,\"prob_sum\":%s,"
                          "\"aux_loss\":%.17g}",
                          r == 0 ? "" : ",", id.layer, ToString(id.module), id.head, s.tokens,
                          JsonArray(s.routed), JsonArray(s.dropped), JsonArray(s.rerouted),
                          JsonArray(s.prob_sum), ComputeBalance(s, id.top_k).aux_loss);
  }
  return out + "]}";
}

int RunLoad(testing::SyntheticRouting& routing, MoeMetrics* moe, ServingMetrics& serving) {
  const DispatchConfig dispatch = DispatchFromFlags();
  SimulatedScheduler scheduler(&serving, absl::GetFlag(FLAGS_seed) + 1,
                               absl::GetFlag(FLAGS_arrivals_per_step),
                               absl::GetFlag(FLAGS_max_running));
  const auto step_time = std::chrono::milliseconds(absl::GetFlag(FLAGS_step_ms));
  while (true) {
    const Clock::time_point start = Clock::now();
    const int64_t tokens = scheduler.Plan(start);
    if (tokens > 0) {
      // Route at most 256 tokens per step: enough for the statistics, and
      // keeps the exporter's CPU use small on shared test machines.
      const StepRoutingStats stats =
          routing.Step(static_cast<int>(std::min<int64_t>(tokens, 256)), dispatch);
      if (moe != nullptr) {
        if (absl::Status status = moe->RecordStep(stats); !status.ok()) {
          std::fprintf(stderr, "%s\n", status.ToString().c_str());
          return 1;
        }
      }
    }
    std::this_thread::sleep_until(start + step_time);
    scheduler.Finish(start);
  }
}

int RunCommanded(testing::SyntheticRouting& routing, MoeMetrics* moe) {
  const DispatchConfig dispatch = DispatchFromFlags();
  StepRoutingStats total;
  total.Reset(routing.routers());
  std::string command;
  int steps = 0, tokens = 0;
  while (std::cin >> command >> steps >> tokens) {
    if (command != "run") {
      std::fprintf(stderr, "unknown command %s\n", command.c_str());
      return 2;
    }
    for (int i = 0; i < steps; ++i) {
      const StepRoutingStats stats = routing.Step(tokens, dispatch);
      total.Add(stats);
      if (moe != nullptr && !moe->RecordStep(stats).ok()) return 1;
    }
    std::printf("%s\n", TotalsJson(routing.routers(), total).c_str());
    std::fflush(stdout);
  }
  return 0;
}

// Per-step cost on the engine thread of the metric updates
// (MoeMetrics::RecordStep and ServingMetrics::RecordStep) for a model of the
// paper's shape, the cost of one scrape (publish + collect + serialise, on an
// exposer thread; includes 100 RecordStep calls between scrapes), and the
// synthetic routing itself for scale.
int RunBench(testing::SyntheticRouting& routing, prometheus::Registry& registry, MoeMetrics* moe,
             ServingMetrics& serving) {
  const DispatchConfig dispatch = DispatchFromFlags();
  const int steps = absl::GetFlag(FLAGS_bench_steps);
  const int tokens = absl::GetFlag(FLAGS_bench_tokens);
  std::vector<StepRoutingStats> inputs;
  const Clock::time_point route_start = Clock::now();
  for (int i = 0; i < 64; ++i) inputs.push_back(routing.Step(tokens, dispatch));
  const double route_us = Seconds(Clock::now() - route_start) / 64 * 1e6;

  const Clock::time_point start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    if (moe != nullptr) (void)moe->RecordStep(inputs[i % inputs.size()]);
    serving.RecordStep({.duration_seconds = 0.02, .decode_tokens = tokens});
    serving.SetEngineState(tokens, 0, 0.5);
  }
  const double update_us = Seconds(Clock::now() - start) / steps * 1e6;

  const int scrapes = 50;
  size_t bytes = 0;
  const Clock::time_point scrape_start = Clock::now();
  for (int i = 0; i < scrapes; ++i) {
    // What one scrape does: publish the pending steps, collect, serialise.
    std::vector<prometheus::MetricFamily> families = registry.Collect();
    if (moe != nullptr) {
      for (auto& family : moe->Collect()) families.push_back(std::move(family));
    }
    bytes += prometheus::TextSerializer().Serialize(families).size();
    // Steps between scrapes (a 15 s interval holds hundreds).
    for (int k = 0; k < 100 && moe != nullptr; ++k) (void)moe->RecordStep(inputs[k % 64]);
  }
  const double scrape_ms = Seconds(Clock::now() - scrape_start) / scrapes * 1e3;
  std::printf(
      "{\"routers\":%zu,\"tokens_per_step\":%d,\"update_us_per_step\":%.3f,"
      "\"synthetic_routing_us_per_step\":%.3f,\"scrape_ms\":%.3f,\"scrape_bytes\":%zu}\n",
      routing.routers().size(), tokens, update_us, route_us, scrape_ms, bytes / scrapes);
  return 0;
}

int Main() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const ModelConfig config =
      model == "paper" ? testing::PaperShapeConfig() : testing::SmallSwitchAllConfig(2);
  testing::SyntheticRouting routing(config, absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_skew));

  auto registry = std::make_shared<prometheus::Registry>();
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {registry};
  std::shared_ptr<MoeMetrics> moe;
  if (absl::GetFlag(FLAGS_moe_metrics)) {
    moe = std::make_shared<MoeMetrics>(routing.routers());
    collectables.push_back(moe);
  }
  ServingMetrics serving(*registry);
  // The output waiting for clients: nothing, of 1 GiB (the dashboard's panel).
  collectables.push_back(
      std::make_shared<OutputBufferMetrics>([] { return int64_t{0}; }, int64_t{1} << 30));
  RegisterModelInfo(*registry, {.model = model,
                                .device = "cpu",
                                .architecture = "switchall",
                                .tokenizer = "byte",
                                .context_length = config.max_seq_len,
                                .kv_cache_dtype = "f32"});
  RegisterBuildInfo(*registry, Version(), Revision());
  MoeMetrics* moe_ptr = moe.get();

  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "bench") return RunBench(routing, *registry, moe_ptr, serving);

  auto exposer =
      MetricsExposer::Start(absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port), collectables);
  if (!exposer.ok()) {
    std::fprintf(stderr, "%s\n", exposer.status().ToString().c_str());
    return 1;
  }
  std::printf("listening %d\n", (*exposer)->port());
  std::fflush(stdout);
  if (mode == "load") return RunLoad(routing, moe_ptr, serving);
  if (mode == "commanded") return RunCommanded(routing, moe_ptr);
  std::fprintf(stderr, "unknown --mode=%s\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace switchserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return switchserve::Main();
}
