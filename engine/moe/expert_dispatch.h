// Expert routing and capacity-aware dispatch for one router over one engine
// step, independent of any tensor library (no BLAS): the CPU backend runs its
// grouped expert matmuls from the token lists built here, and a GPU backend can
// be checked against it.
//
// Two stages:
//   1. RouteTokens: router logits -> gate values, top-k by logit (ties to
//      the lower expert index), the gate weight of each choice, the
//      probabilities the load-balance statistics use.
//   2. DispatchTokens: capacity C = DispatchConfig::CapacityPerExpert(T, k, E),
//      slots filled rank-major (every token's first choice in step order, then
//      every second choice, ...); an assignment that finds its expert full is
//      dropped, or with OverflowPolicy::kReroute moved to the token's next-best
//      expert (by logit) it has not chosen yet that still has a free slot,
//      keeping the weight of the assignment it replaces. Dropless when
//      capacity_factor <= 0.
//
// Plain values; not thread-safe, no locks.
#ifndef SWITCHSERVE_ENGINE_MOE_EXPERT_DISPATCH_H_
#define SWITCHSERVE_ENGINE_MOE_EXPERT_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/moe/routing.h"
#include "engine/moe/routing_stats.h"

namespace switchserve {

enum class GateFunction {
  kSoftmax,      // p = softmax(z) over all experts; weight = p (MoE FFN "softmax")
  kSigmoid,      // p = sigmoid(z); weight = p (SwitchHead "sigmoid", MoE FFN "sigmoid")
  kSoftmaxTopK,  // weight = softmax over the k selected logits (SwitchHead "softmax_topk")
};

// Top-k routing of `tokens` tokens over `n_experts` experts.
struct RouterDecision {
  int tokens = 0;
  int n_experts = 0;
  int top_k = 0;
  std::vector<float> score;       // [T, E] ranking score: the logit (higher first)
  std::vector<float> gate_value;  // [T, E] sigmoid(z) or softmax(z); unused for kSoftmaxTopK
  std::vector<int32_t> expert;    // [T, k] chosen experts in rank order
  std::vector<float> weight;      // [T, k] gate weight of each choice
  std::vector<float> prob;        // [T, E] P(e | token) for the statistics (rows sum to 1)
};

// `logits` is [tokens, n_experts] row-major with row stride `ld` (>= n_experts).
// `renormalize` divides the k weights by their sum (MoE FFN option).
void RouteTokens(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                 GateFunction gate, bool renormalize, RouterDecision* out);

// The outcome of capacity dispatch: for each expert, the tokens it processes
// (in slot order) with their weights, and the fate of every assignment.
struct ExpertAssignments {
  int n_experts = 0;
  int64_t capacity = 0;            // C; 0 when dropless
  std::vector<int32_t> offsets;    // [E + 1]: expert e owns [offsets[e], offsets[e+1])
  std::vector<int32_t> token;      // token index of each slot
  std::vector<float> weight;       // gate weight of each slot
  std::vector<RouteChoice> trace;  // [T, k] fate of each assignment, rank order per token.
                                   // Dropped: expert = the one routed to, gate = the
                                   // weight it would have had (not applied).

  // Scratch reused across DispatchTokens calls (no per-step allocation).
  std::vector<int64_t> load_scratch;
  std::vector<uint8_t> taken_scratch;
  std::vector<int32_t> cursor_scratch;

  int32_t begin(int e) const { return offsets[e]; }
  int32_t end(int e) const { return offsets[e + 1]; }
  int32_t count(int e) const { return offsets[e + 1] - offsets[e]; }
};

// Dispatches `decision` under `dispatch`. Adds this router's figures to `stats`
// (tokens, routed, kept, rerouted, dropped, prob_sum; `stats` must be Reset to
// n_experts), when not null.
void DispatchTokens(const RouterDecision& decision, const DispatchConfig& dispatch,
                    ExpertAssignments* out, RouterStepStats* stats);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MOE_EXPERT_DISPATCH_H_
