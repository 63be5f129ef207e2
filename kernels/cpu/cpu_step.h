// What the CPU backend's layer kernels share within one engine step besides
// the StepBatch: where routing statistics and traces go, and the sequences'
// carried capacity loads. Internal to the CPU backend.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_

#include <cstdint>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "engine/moe/router_layout.h"
#include "engine/moe/routing_stats.h"

namespace switchserve::cpu {

struct RoutingRecorder {
  StepRoutingStats* stats = nullptr;
  // Per router (RouterLayout order): the [T, k] trace; null when no chunk
  // collects routing.
  std::vector<std::vector<RouteChoice>>* traces = nullptr;
  // Sequence scope: each token's sequence and position (the StepBatch's),
  // and the step's carried loads, [S, RouterLayout::total_experts()] (null
  // when the dispatch carries none).
  const int32_t* token_sequence = nullptr;
  const int32_t* positions = nullptr;
  int32_t* group_loads = nullptr;
  int loads_width = 0;
  const RouterLayout* layout = nullptr;
};

// Routes `tokens` rows of router logits, dispatches them under capacity and
// records statistics and trace under `router_index`.
inline void RouteAndDispatch(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                             GateFunction gate, bool renormalize, const DispatchConfig& dispatch,
                             int router_index, const RoutingRecorder& recorder,
                             RouterDecision* decision, ExpertAssignments* out) {
  RouteTokens(logits, ld, tokens, n_experts, top_k, gate, renormalize, decision);
  SequenceGroups groups;
  if (recorder.group_loads != nullptr) {
    groups = {recorder.token_sequence, recorder.positions,
              recorder.group_loads + recorder.layout->ExpertOffset(router_index),
              recorder.loads_width};
  }
  DispatchTokens(*decision, dispatch, recorder.group_loads != nullptr ? &groups : nullptr, out,
                 &recorder.stats->routers[router_index]);
  if (recorder.traces != nullptr) (*recorder.traces)[router_index] = out->trace;
}

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_
