// Per-step MoE routing statistics, accumulated by a backend for every router
// (layer x module x head) of the model, and the load-balance figures derived
// from them (docs/design.md, "Load-balance statistics").
//
// A step's statistics are plain values: the backend fills one StepRoutingStats
// per Forward call and the caller (scheduler, metrics) owns it. Nothing here is
// thread-safe; nothing here takes a lock.
#ifndef SWITCHSERVE_ENGINE_MOE_ROUTING_STATS_H_
#define SWITCHSERVE_ENGINE_MOE_ROUTING_STATS_H_

#include <cstdint>
#include <vector>

#include "engine/moe/router_layout.h"

namespace switchserve {

struct RouterStepStats {
  int64_t tokens = 0;             // T: tokens this router saw in the step
  std::vector<int64_t> routed;    // [E] assignments chosen by top-k (before capacity)
  std::vector<int64_t> kept;      // [E] assignments processed by e (rerouted ones included)
  std::vector<int64_t> rerouted;  // [E] assignments routed to e, moved to another expert
  std::vector<int64_t> dropped;   // [E] assignments routed to e and dropped
  std::vector<double> prob_sum;   // [E] sum over tokens of P(e | token)

  void Reset(int n_experts);
  void Add(const RouterStepStats& other);  // same E
};

// One RouterStepStats per router of a RouterLayout, same order.
struct StepRoutingStats {
  std::vector<RouterStepStats> routers;

  void Reset(const std::vector<RouterId>& ids);
  void Add(const StepRoutingStats& other);
};

// Load-balance figures of one router over some window of tokens.
struct BalanceFigures {
  double aux_loss = 0;         // E * sum_e f_e * P_e; 1 when balanced, up to E/k
  double load_cv = 0;          // std/mean of routed counts
  double dead_fraction = 0;    // share of experts with no routed assignment
  double entropy = 0;          // entropy (nats) of the routed-assignment shares
  double max_utilization = 0;  // max_e routed_e / (T*k/E)
};
BalanceFigures ComputeBalance(const RouterStepStats& stats, int top_k);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MOE_ROUTING_STATS_H_
