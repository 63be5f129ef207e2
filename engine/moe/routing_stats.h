// Per-step MoE routing statistics, accumulated by a backend for every router
// (layer x module x head) of the model, and the load-balance figures derived
// from them (DESIGN.md, "Load-balance statistics").
//
// A step's statistics are plain values: the backend fills one StepRoutingStats
// per Forward call and the caller (scheduler, metrics) owns it. Nothing here is
// thread-safe; nothing here takes a lock.
#ifndef SWITCHSERVE_ENGINE_MOE_ROUTING_STATS_H_
#define SWITCHSERVE_ENGINE_MOE_ROUTING_STATS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/model/model_config.h"

namespace switchserve {

enum class MoeModule { kAttnV, kAttnO, kFfn };
std::string_view ToString(MoeModule module);  // "attn_v", "attn_o", "ffn"

// Identifies one router. For attention, `head` is the KV head (attn_v) or query
// head (attn_o), 0 with a shared router; for the FFN it is 0.
struct RouterId {
  int layer = 0;
  MoeModule module = MoeModule::kFfn;
  int head = 0;
  int n_experts = 0;
  int top_k = 0;
};

// Every router of a model, in a fixed order: layer-major, then attn_v, attn_o,
// ffn, then head. Dense modules and E = 1 attention have no router.
std::vector<RouterId> EnumerateRouters(const ModelConfig& config);

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

// One RouterStepStats per EnumerateRouters() entry, same order.
struct StepRoutingStats {
  std::vector<RouterStepStats> routers;

  void Reset(const std::vector<RouterId>& ids);
  void Add(const StepRoutingStats& other);
};

// Load-balance figures of one router over some window of tokens.
struct BalanceFigures {
  double aux_loss = 0;         // E * sum_e f_e * P_e; 1 when balanced, up to E
  double load_cv = 0;          // std/mean of routed counts
  double dead_fraction = 0;    // share of experts with no routed assignment
  double entropy = 0;          // entropy (nats) of the routed-assignment shares
  double max_utilization = 0;  // max_e routed_e / (T*k/E)
};
BalanceFigures ComputeBalance(const RouterStepStats& stats, int top_k);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MOE_ROUTING_STATS_H_
