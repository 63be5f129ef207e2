// Expert routing and capacity-aware dispatch for one router over one engine
// step, independent of any tensor library (no BLAS): the CPU backend runs its
// grouped expert matmuls from the token lists built here, and a GPU backend
// must reproduce its decisions exactly (docs/design.md, "Capacity-aware
// dispatch").
//
// Two stages:
//   1. RouteTokens: router logits -> gate values, top-k by logit (ties to
//      the lower expert index), the gate weight of each choice, the
//      probabilities the load-balance statistics use.
//   2. DispatchTokens: every assignment (token t, rank r) in turn is placed
//      against the loads of the slots it competes for (below):
//        - its expert e has a free slot (load[e] < C): kept, load[e]++;
//        - else, with OverflowPolicy::kReroute, the token's best-ranked expert
//          x (by logit, ties to the lower index) that is neither one of its k
//          choices (also those of later ranks) nor an expert this token was
//          already rerouted to by this router, and with load[x] < C now:
//          rerouted to x, load[x]++, keeping the weight of choice r;
//        - else dropped (the trace keeps the weight it would have had).
//      Reroute happens inline: before the next assignment is placed. With
//      capacity_factor <= 0 everything is kept (dropless) and no loads are
//      read or written.
//
// Capacity scopes (DispatchConfig::scope):
//   kSequence  C = DispatchConfig::CapacityPerExpert(capacity_group, k, E)
//              slots per expert for every aligned group of G = capacity_group
//              positions of each sequence ([0, G), [G, 2G), ...; the last,
//              partial group gets the same C). Tokens are placed in the order
//              given (each sequence's tokens are consecutive positions in
//              increasing order), each token's k choices in rank order,
//              against the loads of its own sequence's current group. A token
//              at a position p with p % G == 0 first resets its sequence's
//              loads to zero. So a token's fate depends only on the earlier
//              positions of its own group: bit-identical in a full pass,
//              chunked prefill, decode, recompute, and whatever else is in the
//              step. The loads a sequence carries into the step (the group of
//              the position before its first token) come in through
//              SequenceGroups and are updated in place.
//              A parallel formulation (a GPU port): for drop/dropless the
//              slot an assignment asks for is the carried load plus a
//              segmented exclusive prefix count over (sequence, group,
//              expert) in (position, rank) order; reroute is sequential per
//              sequence (sequences are independent of each other).
//   kStep      C = DispatchConfig::CapacityPerExpert(T, k, E) for the T tokens
//              of the step, one set of loads for the whole step, filled
//              rank-major: every token's first choice in step order, then
//              every second choice, ... (the Switch Transformer rule; lets
//              one sequence change another's routing).
//
// Slot order within an expert (ExpertAssignments::token) is the fill order:
// (token, rank) under kSequence, (rank, token) under kStep.
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

// RouteTokens in two parts, for routing a step's rows in ranges (on several
// threads): `out` sized for `tokens` rows, then rows [begin, end) of
// `logits` (the whole [tokens, n_experts] matrix) routed into it. Each row's
// decision is its own, so ranges that cover the rows give RouteTokens's.
void SizeRouterDecision(int tokens, int n_experts, int top_k, RouterDecision* out);
void RouteTokenRows(const float* logits, int64_t ld, int begin, int end, GateFunction gate,
                    bool renormalize, RouterDecision* out);

// The outcome of capacity dispatch: for each expert, the tokens it processes
// (in slot order) with their weights, and the fate of every assignment.
struct ExpertAssignments {
  int n_experts = 0;
  int64_t capacity = 0;            // C per group (kSequence) or step (kStep); 0 when dropless
  std::vector<int32_t> offsets;    // [E + 1]: expert e owns [offsets[e], offsets[e+1])
  std::vector<int32_t> token;      // token index of each slot
  std::vector<float> weight;       // gate weight of each slot
  std::vector<RouteChoice> trace;  // [T, k] fate of each assignment, rank order per token.
                                   // Dropped: expert = the one routed to, gate = the
                                   // weight it would have had (not applied).

  // Scratch reused across DispatchTokens calls (no per-step allocation).
  std::vector<int32_t> load_scratch;
  std::vector<uint8_t> taken_scratch;
  std::vector<int32_t> cursor_scratch;

  int32_t begin(int e) const { return offsets[e]; }
  int32_t end(int e) const { return offsets[e + 1]; }
  int32_t count(int e) const { return offsets[e + 1] - offsets[e]; }
};

// Where the decision's tokens sit, for the kSequence scope. Row s of `loads`
// is sequence s's per-expert loads for this router (E values; rows
// `loads_stride` apart, so that a backend can keep every router's loads of a
// sequence in one row): on entry those of the group holding the position just
// before the sequence's first token in this step (never read when that token
// opens a group), on return those of the group holding its last token.
struct SequenceGroups {
  const int32_t* token_sequence = nullptr;  // [T] row of `loads` of each token
  const int32_t* positions = nullptr;       // [T] absolute position of each token
  int32_t* loads = nullptr;                 // [sequences, loads_stride], in/out
  int64_t loads_stride = 0;
};

// Dispatches `decision` under `dispatch`. `groups` is read only under the
// kSequence scope with a capacity; null there means one sequence at positions
// 0 .. T-1. Adds this router's figures to `stats` (tokens, routed, kept,
// rerouted, dropped, prob_sum; `stats` must be Reset to n_experts), when not
// null.
void DispatchTokens(const RouterDecision& decision, const DispatchConfig& dispatch,
                    const SequenceGroups* groups, ExpertAssignments* out, RouterStepStats* stats);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MOE_EXPERT_DISPATCH_H_
