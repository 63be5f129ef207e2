// Synthetic engine steps for the metrics tests: random router logits pushed
// through the engine's own routing and capacity dispatch (RouteTokens,
// DispatchTokens), so the StepRoutingStats the metrics see are exactly what a
// backend would record for those logits.
#ifndef SWITCHSERVE_TESTS_METRICS_SYNTHETIC_ROUTING_H_
#define SWITCHSERVE_TESTS_METRICS_SYNTHETIC_ROUTING_H_

#include <cstdint>
#include <random>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/moe/routing_stats.h"

namespace switchserve::testing {

// A model of the SwitchHead paper's shape (18 layers, H = 4 heads with E = 4
// experts each, k = 2, and a 32-expert top-1 MoE FFN).
ModelConfig PaperShapeConfig();
// A small SwitchAll model: `layers` layers, 2 heads x 4 experts (k 2), FFN 8
// experts (k 2).
ModelConfig SmallSwitchAllConfig(int layers);

class SyntheticRouting {
 public:
  // `skew` is added to expert 0's logit of every router of layer 0 (0: all
  // experts equally likely on average; large: layer 0 collapses onto expert 0).
  SyntheticRouting(const ModelConfig& config, uint32_t seed, double skew);

  const std::vector<RouterId>& routers() const { return routers_; }

  // One step of `tokens` tokens through every router under `dispatch`.
  StepRoutingStats Step(int tokens, const DispatchConfig& dispatch);

 private:
  ModelConfig config_;
  std::vector<RouterId> routers_;
  std::mt19937 rng_;
  double skew_;
  std::vector<float> logits_;
};

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_METRICS_SYNTHETIC_ROUTING_H_
