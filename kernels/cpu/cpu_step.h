// What the CPU backend's layer kernels share within one engine step: where
// each token of the ragged batch sits (position, cache row), and where routing
// statistics and traces go. Internal to the CPU backend.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_

#include <cstdint>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "engine/moe/routing_stats.h"
#include "engine/runtime/backend.h"

namespace switchserve::cpu {

// The step's tokens in step order (chunk order, then position).
struct StepLayout {
  int tokens = 0;
  int block_size = 0;
  std::vector<int32_t> position;   // [T] absolute position
  std::vector<int32_t> chunk;      // [T] chunk index
  std::vector<int64_t> cache_row;  // [T] block * block_size + position % block_size
  std::vector<const std::vector<int32_t>*> block_table;  // [chunks]

  // Cache row of position `pos` of the sequence of chunk `c`.
  int64_t CacheRow(int c, int pos) const {
    return static_cast<int64_t>((*block_table[c])[pos / block_size]) * block_size +
           pos % block_size;
  }
};

struct RoutingRecorder {
  StepRoutingStats* stats = nullptr;
  // Per router (RouterLayout order): the [T, k] trace; null when no chunk
  // collects routing.
  std::vector<std::vector<RouteChoice>>* traces = nullptr;
};

// Routes `tokens` rows of router logits, dispatches them under capacity and
// records statistics and trace under `router_index`.
inline void RouteAndDispatch(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                             GateFunction gate, bool renormalize, const DispatchConfig& dispatch,
                             int router_index, const RoutingRecorder& recorder,
                             RouterDecision* decision, ExpertAssignments* out) {
  RouteTokens(logits, ld, tokens, n_experts, top_k, gate, renormalize, decision);
  DispatchTokens(*decision, dispatch, out, &recorder.stats->routers[router_index]);
  if (recorder.traces != nullptr) (*recorder.traces)[router_index] = out->trace;
}

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_
