// What the CPU backend's layer kernels share within one engine step besides
// the StepBatch: where routing statistics and traces go, the sequences'
// carried capacity loads, and the routers that fill them. Internal to the
// CPU backend.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_

#include <cstdint>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "engine/moe/router_layout.h"
#include "engine/moe/routing_stats.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/worker_pool.h"

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

// Routes a module's routers over a step's tokens, dispatches each under
// capacity and records statistics and traces. Not thread-safe: owns the
// routers' decisions, reused across calls.
class StepRouters {
 public:
  // `pool` must outlive this.
  explicit StepRouters(WorkerPool* pool) : pool_(pool) {}

  // `count` routers of one shape: router r's [tokens, n_experts] logits at
  // logits + r * n_experts (row stride ld), recorded under first_router + r,
  // dispatched into out[r]. Their rows are routed in ranges on the pool
  // (each row's decision is its own: RouteTokenRows), then each router is
  // dispatched, one piece of a pool job each where there are several (a
  // router's dispatch reads and writes only its own assignments, loads,
  // statistics and trace).
  void Run(const float* logits, int64_t ld, int count, int tokens, int n_experts, int top_k,
           GateFunction gate, bool renormalize, const DispatchConfig& dispatch, int first_router,
           const RoutingRecorder& recorder, ExpertAssignments* out) {
    if (decisions_.size() < static_cast<size_t>(count)) decisions_.resize(count);
    for (int r = 0; r < count; ++r) SizeRouterDecision(tokens, n_experts, top_k, &decisions_[r]);
    // Routing a logit (its gate, its place in the top k, the statistics'
    // probability) takes about 15 ns; a pool job pays where there are at
    // least kMinParallelLogits (about 30 us on one thread): a prefill's, not
    // a decode step's (the paper shape at batch 32: the same step time either
    // way; the built-in model's small steps: pool jobs for nothing).
    constexpr int64_t kMinParallelLogits = 2048;
    const int64_t logits_routed = int64_t{tokens} * n_experts * count;
    ForRowRanges(pool_, tokens, logits_routed, kMinParallelLogits, [&](int begin, int end) {
      for (int r = 0; r < count; ++r) {
        RouteTokenRows(logits + static_cast<int64_t>(r) * n_experts, ld, begin, end, gate,
                       renormalize, &decisions_[r]);
      }
    });
    const auto dispatch_router = [&](int r, int) {
      const int router = first_router + r;
      SequenceGroups groups;
      if (recorder.group_loads != nullptr) {
        groups = {recorder.token_sequence, recorder.positions,
                  recorder.group_loads + recorder.layout->ExpertOffset(router),
                  recorder.loads_width};
      }
      DispatchTokens(decisions_[r], dispatch, recorder.group_loads != nullptr ? &groups : nullptr,
                     &out[r], &recorder.stats->routers[router]);
      if (recorder.traces != nullptr) (*recorder.traces)[router] = out[r].trace;
    };
    if (count > 1 && logits_routed >= kMinParallelLogits) {
      pool_->Run(count, dispatch_router);
    } else {
      for (int r = 0; r < count; ++r) dispatch_router(r, 0);
    }
  }

 private:
  WorkerPool* pool_;
  std::vector<RouterDecision> decisions_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_STEP_H_
