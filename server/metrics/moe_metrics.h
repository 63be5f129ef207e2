// Prometheus metrics of MoE routing: per-expert counters (the source of
// truth, so any window can be recomputed in PromQL) and per-router gauges of
// the load-balance figures over a sliding window of recent engine steps
// (DESIGN.md, "Load-balance statistics"; docs/metrics.md lists every series).
//
// The engine accumulates a StepRoutingStats per step; the thread that runs the
// steps hands it to RecordStep once per step. RecordStep touches only
// pre-registered metric objects (atomic counters and gauges, no registry
// lookups, no allocation after the first window), so a scrape running on the
// exposer's threads never waits on it and it never waits on a scrape.
//
// Thread-compatible: one thread calls RecordStep at a time (the engine step
// thread). The registry may be collected concurrently from any thread.
#ifndef SWITCHSERVE_SERVER_METRICS_MOE_METRICS_H_
#define SWITCHSERVE_SERVER_METRICS_MOE_METRICS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/routing_stats.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace switchserve {

struct MoeMetricsOptions {
  // The gauges describe the last `window_steps` steps that routed tokens.
  int window_steps = 64;
};

class MoeMetrics {
 public:
  // Registers every series of `routers` (EnumerateRouters order) in
  // `registry`, all at zero. `registry` must outlive this object.
  MoeMetrics(prometheus::Registry& registry, std::vector<RouterId> routers,
             MoeMetricsOptions options = {});

  MoeMetrics(const MoeMetrics&) = delete;
  MoeMetrics& operator=(const MoeMetrics&) = delete;

  // Adds one engine step. `step.routers` must be empty (nothing routed: no-op)
  // or hold one entry per router with its E experts; otherwise
  // INVALID_ARGUMENT and nothing is recorded.
  absl::Status RecordStep(const StepRoutingStats& step);

  const std::vector<RouterId>& routers() const { return routers_; }
  // Sum of the steps in the current window for router `index` (tokens,
  // routed, prob_sum; the other fields are not kept). For tests.
  const RouterStepStats& WindowTotals(int index) const { return window_[index]; }

 private:
  struct RouterSeries {
    prometheus::Counter* tokens = nullptr;
    std::vector<prometheus::Counter*> assignments;  // [E]
    std::vector<prometheus::Counter*> dropped;      // [E]
    std::vector<prometheus::Counter*> rerouted;     // [E]
    std::vector<prometheus::Counter*> prob_sum;     // [E]
    prometheus::Gauge* aux_loss = nullptr;
    prometheus::Gauge* load_cv = nullptr;
    prometheus::Gauge* dead_ratio = nullptr;
    prometheus::Gauge* entropy = nullptr;
    prometheus::Gauge* max_utilization = nullptr;
    int expert_offset = 0;  // first column of this router in the flat ring rows
  };

  absl::Status Validate(const StepRoutingStats& step) const;
  void UpdateCounters(const StepRoutingStats& step);
  void AdvanceWindow(const StepRoutingStats& step);
  void UpdateGauges();

  std::vector<RouterId> routers_;
  MoeMetricsOptions options_;
  std::vector<RouterSeries> series_;
  int total_experts_ = 0;

  // Sliding window: a ring of the last window_steps steps (tokens per router,
  // routed and prob_sum per expert of every router, flattened) and its sum.
  std::vector<std::vector<int64_t>> ring_tokens_;  // [slot][router]
  std::vector<std::vector<int64_t>> ring_routed_;  // [slot][flat expert]
  std::vector<std::vector<double>> ring_prob_;     // [slot][flat expert]
  int ring_next_ = 0;
  int ring_filled_ = 0;
  std::vector<RouterStepStats> window_;  // [router]
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_MOE_METRICS_H_
