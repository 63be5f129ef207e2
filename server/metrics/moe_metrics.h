// Prometheus metrics of MoE routing: per-expert counters (the source of
// truth, so any window can be recomputed in PromQL) and per-router gauges of
// the load-balance figures over a sliding window of recent engine steps
// (docs/design.md, "Load-balance statistics"; docs/metrics.md lists every series).
//
// The engine accumulates a StepRoutingStats per step; the thread that runs the
// steps hands it to RecordStep once per step, which adds it to plain pending
// totals and the window under one short mutex hold (7-10 us measured for a
// model of the paper's shape; no atomics, no allocation, no registry calls).
// The pending totals reach the Prometheus counters and gauges when the
// metrics are collected (a scrape) or Publish is called, on the caller's
// thread, so a step never pays for the thousands of atomic counter updates
// and balance figures, and a scrape always sees every step recorded before it.
//
// Register the object with the exposer as a Collectable (it owns its
// registry). Thread-safe: RecordStep from one thread at a time (the engine
// step thread); Collect and Publish from any thread.
#ifndef SWITCHSERVE_SERVER_METRICS_MOE_METRICS_H_
#define SWITCHSERVE_SERVER_METRICS_MOE_METRICS_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "engine/moe/routing_stats.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace switchserve {

struct MoeMetricsOptions {
  // The gauges describe the last `window_steps` steps that routed tokens.
  int window_steps = 64;
};

class MoeMetrics : public prometheus::Collectable {
 public:
  // Registers every series of `routers` (RouterLayout order), all at zero.
  explicit MoeMetrics(std::vector<RouterId> routers, MoeMetricsOptions options = {});

  MoeMetrics(const MoeMetrics&) = delete;
  MoeMetrics& operator=(const MoeMetrics&) = delete;

  // Adds one engine step. `step.routers` must be empty (nothing routed: no-op)
  // or hold one entry per router with its E experts; otherwise
  // INVALID_ARGUMENT and nothing is recorded.
  absl::Status RecordStep(const StepRoutingStats& step);

  // Moves the steps recorded so far into the counters and recomputes the
  // gauges from the current window.
  void Publish() const;

  // Publish, then every MoE series.
  std::vector<prometheus::MetricFamily> Collect() const override;

  const std::vector<RouterId>& routers() const { return routers_; }

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
    int expert_offset = 0;  // first column of this router in the flat arrays
  };
  // Per-router tokens and per-expert figures of every router, flattened.
  struct FlatTotals {
    std::vector<int64_t> tokens;    // [router]
    std::vector<int64_t> routed;    // [flat expert]
    std::vector<int64_t> dropped;   // [flat expert]
    std::vector<int64_t> rerouted;  // [flat expert]
    std::vector<double> prob_sum;   // [flat expert]

    void Resize(size_t routers, size_t experts);
    void Zero();
  };

  absl::Status Validate(const StepRoutingStats& step) const;
  void AddToPending(const StepRoutingStats& step);   // mutex_ held
  void AdvanceWindow(const StepRoutingStats& step);  // mutex_ held
  void ApplyCounters(const FlatTotals& delta) const;
  void ApplyGauges(const FlatTotals& window) const;

  std::vector<RouterId> routers_;
  MoeMetricsOptions options_;
  prometheus::Registry registry_;
  std::vector<RouterSeries> series_;
  int total_experts_ = 0;

  // Guards pending_, the window and window_changed_. Held by RecordStep for
  // one step's additions and by Publish for two copies.
  mutable std::mutex mutex_;
  mutable FlatTotals pending_;  // steps not yet in the counters
  // Sliding window: a ring of the last window_steps steps (tokens, routed and
  // prob_sum only) and its sum.
  std::vector<FlatTotals> ring_;
  int ring_next_ = 0;
  int ring_filled_ = 0;
  FlatTotals window_;
  mutable bool window_changed_ = false;

  // Publish's working copies; publish_mutex_ serialises concurrent scrapes.
  mutable std::mutex publish_mutex_;
  mutable FlatTotals publish_delta_;
  mutable FlatTotals publish_window_;
  mutable RouterStepStats publish_router_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_MOE_METRICS_H_
