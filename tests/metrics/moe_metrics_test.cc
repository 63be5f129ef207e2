#include "server/metrics/moe_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "engine/moe/routing_stats.h"
#include "tests/metrics/registry_reader.h"
#include "tests/metrics/synthetic_routing.h"

namespace switchserve {
namespace {

using testing::LabelMap;
using testing::RegistryReader;

LabelMap RouterLabels(const RouterId& id) {
  return {{"layer", std::to_string(id.layer)},
          {"module", std::string(ToString(id.module))},
          {"head", std::to_string(id.head)}};
}

LabelMap ExpertLabels(const RouterId& id, int e) {
  LabelMap labels = RouterLabels(id);
  labels["expert"] = std::to_string(e);
  return labels;
}

DispatchConfig Capacity(double factor) {
  DispatchConfig dispatch;
  dispatch.capacity_factor = factor;
  dispatch.scope = CapacityScope::kStep;  // the synthetic steps share one capacity
  return dispatch;
}

// The exposition of a model of the paper's shape: docs/metrics.md quotes
// these numbers.
TEST(MoeMetricsTest, PaperShapeSeriesCount) {
  const std::vector<RouterId> routers = RouterLayout(testing::PaperShapeConfig()).routers();
  ASSERT_EQ(routers.size(), 18u * (4 + 4 + 1));
  MoeMetrics metrics(routers);
  RegistryReader reader(metrics);
  for (const char* name :
       {"switchserve_moe_assignments_total", "switchserve_moe_dropped_total",
        "switchserve_moe_rerouted_total", "switchserve_moe_gate_probability_sum_total"}) {
    EXPECT_EQ(reader.ExposedSeries(name), 18u * (4 * 4 + 4 * 4 + 32)) << name;
  }
  for (const char* name : {"switchserve_moe_router_tokens_total", "switchserve_moe_aux_loss",
                           "switchserve_moe_load_cv", "switchserve_moe_dead_experts_ratio",
                           "switchserve_moe_routing_entropy", "switchserve_moe_max_utilization"}) {
    EXPECT_EQ(reader.ExposedSeries(name), 162u) << name;
  }
  EXPECT_EQ(reader.AllExposedSeries(), 5580u);
}

TEST(MoeMetricsTest, SeriesStartAtZero) {
  const std::vector<RouterId> routers = RouterLayout(testing::SmallSwitchAllConfig(2)).routers();
  MoeMetrics metrics(routers);
  RegistryReader reader(metrics);
  for (const RouterId& id : routers) {
    EXPECT_EQ(reader.Counter("switchserve_moe_router_tokens_total", RouterLabels(id)), 0.0);
    for (int e = 0; e < id.n_experts; ++e) {
      EXPECT_EQ(reader.Counter("switchserve_moe_dropped_total", ExpertLabels(id, e)), 0.0);
      EXPECT_EQ(reader.Counter("switchserve_moe_assignments_total", ExpertLabels(id, e)), 0.0);
    }
  }
}

// Counters add up every step exactly as the engine recorded it.
TEST(MoeMetricsTest, CountersSumTheSteps) {
  testing::SyntheticRouting routing(testing::SmallSwitchAllConfig(2), /*seed=*/7, /*skew=*/2.0);
  MoeMetrics metrics(routing.routers());
  StepRoutingStats total;
  total.Reset(routing.routers());
  for (int step = 0; step < 5; ++step) {
    const StepRoutingStats stats = routing.Step(17 + step, Capacity(1.0));
    ASSERT_TRUE(metrics.RecordStep(stats).ok());
    total.Add(stats);
  }
  RegistryReader reader(metrics);
  int64_t dropped = 0;
  for (size_t r = 0; r < routing.routers().size(); ++r) {
    const RouterId& id = routing.routers()[r];
    const RouterStepStats& s = total.routers[r];
    EXPECT_EQ(reader.Counter("switchserve_moe_router_tokens_total", RouterLabels(id)),
              static_cast<double>(s.tokens));
    for (int e = 0; e < id.n_experts; ++e) {
      const LabelMap labels = ExpertLabels(id, e);
      EXPECT_EQ(reader.Counter("switchserve_moe_assignments_total", labels),
                static_cast<double>(s.routed[e]));
      EXPECT_EQ(reader.Counter("switchserve_moe_dropped_total", labels),
                static_cast<double>(s.dropped[e]));
      EXPECT_EQ(reader.Counter("switchserve_moe_rerouted_total", labels),
                static_cast<double>(s.rerouted[e]));
      EXPECT_NEAR(*reader.Counter("switchserve_moe_gate_probability_sum_total", labels),
                  s.prob_sum[e], 1e-9 * s.tokens);
      dropped += s.dropped[e];
    }
  }
  EXPECT_GT(dropped, 0) << "capacity factor 1 with a skewed layer 0 should drop";
}

// A step whose router probabilities are NaN (a model that overflows) adds
// nothing to the probability counter or the window: one such step left the
// counter, and the aux loss from it, NaN until the server restarted.
TEST(MoeMetricsTest, NonFiniteProbabilitiesAddNothing) {
  testing::SyntheticRouting routing(testing::SmallSwitchAllConfig(1), /*seed=*/5, /*skew=*/1.0);
  MoeMetrics metrics(routing.routers(), MoeMetricsOptions{.window_steps = 4});
  const StepRoutingStats first = routing.Step(16, Capacity(2.0));
  StepRoutingStats broken = routing.Step(16, Capacity(2.0));
  for (RouterStepStats& s : broken.routers) {
    s.prob_sum[0] = std::numeric_limits<double>::quiet_NaN();
    s.prob_sum[1] = std::numeric_limits<double>::infinity();
  }
  ASSERT_TRUE(metrics.RecordStep(first).ok());
  ASSERT_TRUE(metrics.RecordStep(broken).ok());
  RegistryReader reader(metrics);
  for (size_t r = 0; r < routing.routers().size(); ++r) {
    const RouterId& id = routing.routers()[r];
    for (int e = 0; e < id.n_experts; ++e) {
      const double want =
          first.routers[r].prob_sum[e] + (e < 2 ? 0.0 : broken.routers[r].prob_sum[e]);
      EXPECT_NEAR(
          *reader.Counter("switchserve_moe_gate_probability_sum_total", ExpertLabels(id, e)), want,
          1e-9)
          << "router " << r << " expert " << e;
    }
    EXPECT_TRUE(std::isfinite(*reader.Gauge("switchserve_moe_aux_loss", RouterLabels(id))));
  }
}

// The aux loss recomputed from the counters (what the PromQL in
// docs/metrics.md does) equals the engine's ComputeBalance over the same steps.
TEST(MoeMetricsTest, AuxLossFromCountersMatchesEngine) {
  testing::SyntheticRouting routing(testing::SmallSwitchAllConfig(1), /*seed=*/3, /*skew=*/1.0);
  MoeMetrics metrics(routing.routers());
  StepRoutingStats total;
  total.Reset(routing.routers());
  for (int step = 0; step < 4; ++step) {
    const StepRoutingStats stats = routing.Step(32, Capacity(0.0));
    ASSERT_TRUE(metrics.RecordStep(stats).ok());
    total.Add(stats);
  }
  RegistryReader reader(metrics);
  for (size_t r = 0; r < routing.routers().size(); ++r) {
    const RouterId& id = routing.routers()[r];
    double assignments = 0;
    for (int e = 0; e < id.n_experts; ++e) {
      assignments += *reader.Counter("switchserve_moe_assignments_total", ExpertLabels(id, e));
    }
    const double tokens = *reader.Counter("switchserve_moe_router_tokens_total", RouterLabels(id));
    double sum = 0;
    for (int e = 0; e < id.n_experts; ++e) {
      const LabelMap labels = ExpertLabels(id, e);
      sum += *reader.Counter("switchserve_moe_assignments_total", labels) / assignments *
             *reader.Counter("switchserve_moe_gate_probability_sum_total", labels) / tokens;
    }
    const double engine = ComputeBalance(total.routers[r], id.top_k).aux_loss;
    EXPECT_NEAR(id.n_experts * sum, engine, 1e-9) << "router " << r;
    // The window (64 steps) holds all four steps, so the gauge agrees too.
    EXPECT_NEAR(*reader.Gauge("switchserve_moe_aux_loss", RouterLabels(id)), engine, 1e-9);
  }
}

// The gauges describe only the last window_steps steps.
TEST(MoeMetricsTest, GaugesSlideOverTheWindow) {
  testing::SyntheticRouting routing(testing::SmallSwitchAllConfig(1), /*seed=*/11, /*skew=*/3.0);
  MoeMetrics metrics(routing.routers(), MoeMetricsOptions{.window_steps = 3});
  std::vector<StepRoutingStats> steps;
  for (int step = 0; step < 8; ++step) {
    steps.push_back(routing.Step(8 + 3 * step, Capacity(1.25)));
    ASSERT_TRUE(metrics.RecordStep(steps.back()).ok());
  }
  StepRoutingStats window;
  window.Reset(routing.routers());
  for (int step = 5; step < 8; ++step) window.Add(steps[step]);
  RegistryReader reader(metrics);
  for (size_t r = 0; r < routing.routers().size(); ++r) {
    const RouterId& id = routing.routers()[r];
    const BalanceFigures want = ComputeBalance(window.routers[r], id.top_k);
    const LabelMap labels = RouterLabels(id);
    EXPECT_NEAR(*reader.Gauge("switchserve_moe_aux_loss", labels), want.aux_loss, 1e-9);
    EXPECT_NEAR(*reader.Gauge("switchserve_moe_load_cv", labels), want.load_cv, 1e-9);
    EXPECT_NEAR(*reader.Gauge("switchserve_moe_dead_experts_ratio", labels), want.dead_fraction,
                1e-12);
    EXPECT_NEAR(*reader.Gauge("switchserve_moe_routing_entropy", labels), want.entropy, 1e-9);
    EXPECT_NEAR(*reader.Gauge("switchserve_moe_max_utilization", labels), want.max_utilization,
                1e-9);
  }
  // Layer 0 is skewed onto expert 0: its aux loss is well above balance.
  EXPECT_GT(*reader.Gauge("switchserve_moe_aux_loss", RouterLabels(routing.routers()[0])), 1.1);
}

// A dropless run records zero dropped and rerouted assignments.
TEST(MoeMetricsTest, DroplessRecordsNoDrops) {
  testing::SyntheticRouting routing(testing::SmallSwitchAllConfig(2), /*seed=*/5, /*skew=*/4.0);
  MoeMetrics metrics(routing.routers());
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(metrics.RecordStep(routing.Step(40, Capacity(0.0))).ok());
  }
  RegistryReader reader(metrics);
  for (const RouterId& id : routing.routers()) {
    for (int e = 0; e < id.n_experts; ++e) {
      EXPECT_EQ(reader.Counter("switchserve_moe_dropped_total", ExpertLabels(id, e)), 0.0);
      EXPECT_EQ(reader.Counter("switchserve_moe_rerouted_total", ExpertLabels(id, e)), 0.0);
    }
  }
}

TEST(MoeMetricsTest, MismatchedStepIsRejected) {
  const std::vector<RouterId> routers = RouterLayout(testing::SmallSwitchAllConfig(2)).routers();
  MoeMetrics metrics(routers);
  StepRoutingStats empty;
  EXPECT_TRUE(metrics.RecordStep(empty).ok());  // nothing routed this step

  StepRoutingStats short_step;
  short_step.Reset(std::vector<RouterId>(routers.begin(), routers.end() - 1));
  short_step.routers[0].tokens = 4;
  EXPECT_EQ(metrics.RecordStep(short_step).code(), absl::StatusCode::kInvalidArgument);

  StepRoutingStats wrong_experts;
  wrong_experts.Reset(routers);
  wrong_experts.routers[1].Reset(3);
  wrong_experts.routers[1].tokens = 4;
  EXPECT_EQ(metrics.RecordStep(wrong_experts).code(), absl::StatusCode::kInvalidArgument);

  RegistryReader reader(metrics);
  EXPECT_EQ(reader.Counter("switchserve_moe_router_tokens_total", RouterLabels(routers[0])), 0.0);
}

}  // namespace
}  // namespace switchserve
