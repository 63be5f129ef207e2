// Capacity dispatch of one router's step on the GPU: the decisions of the
// CPU's DispatchTokens (engine/moe/expert_dispatch.h), step scope, made on device
// memory by one block. Assignments are taken rank-major (a = r * T + t: every
// token's first choice in step order, then every second choice, ...).
//
//   drop / dropless  pos(a) = earlier assignments to the same expert, from a
//                    stable counting pass (__match_any_sync + __popc per warp,
//                    per-warp counts in shared memory; no atomics); kept iff
//                    pos < C (always when dropless).
//   reroute          sequential by definition: one warp commits up to 32
//                    assignments at a time, up to the first that would
//                    overflow, which it then moves alone to the token's best
//                    expert not yet chosen that still has room (warp argmax of
//                    the logits, ties to the lower expert), or drops.
// Then the slots: kept and rerouted assignments grouped by final expert,
// offsets[e] + their stable rank (the same counting pass), and the step's
// statistics.
#ifndef SWITCHSERVE_KERNELS_CUDA_DISPATCH_PLAN_H_
#define SWITCHSERVE_KERNELS_CUDA_DISPATCH_PLAN_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace switchserve::cuda {

// kForced: the trace outputs already hold every assignment's expert, gate
// and fate (a test replaying another backend's routing); only the slots and
// statistics are built from them.
enum class DispatchMode : int { kDrop, kReroute, kDropless, kForced };

// The fate of an assignment, as the CPU's RouteFate.
enum class DeviceFate : uint8_t { kKept = 0, kRerouted = 1, kDropped = 2 };

struct DispatchPlanInput {
  const int32_t* expert = nullptr;  // [T, k] routed experts, rank order per token
  const float* weight = nullptr;    // [T, k] their gate weights
  const float* score = nullptr;     // [T, E] logits, row stride score_ld (reroute only)
  int64_t score_ld = 0;
  const float* prob = nullptr;  // [T, E] P(e | token), for prob_sum
  int tokens = 0;
  int top_k = 0;
  int n_experts = 0;
  int64_t capacity = 0;  // C = DispatchConfig::CapacityPerExpert(T, k, E); unused when dropless
  DispatchMode mode = DispatchMode::kDrop;
  // Several routers of one module (the heads of an attention layer), one block
  // each: router r reads expert, weight + r * T * k, prob + r * T * E and
  // score + r * score_router_offset, and writes every output at the same
  // per-router strides (offsets: E + 1, counts: 4 * E, prob_sum: E).
  int routers = 1;
  int64_t score_router_offset = 0;
  // Device memory, or null for all: only tokens [0, *counted_tokens) enter
  // counts and prob_sum (the rows after them pad a decode step to its
  // graph's size).
  const int32_t* counted_tokens = nullptr;
  // Sequence scope when set (see SequenceScope): capacity per sequence and
  // group, slots in (token, rank) order.
  const struct SequenceScope* sequence = nullptr;
};

// The sequence capacity scope (docs/design.md, "Capacity-aware dispatch"):
// C = `capacity` slots per expert for every aligned group of `group_size`
// positions of each sequence; a token at a position p with p % group_size == 0
// starts its sequence's loads from zero, others continue them; within a
// group, tokens in position order, each token's k choices in rank order,
// placed as in step scope (kept, else rerouted to the best expert not chosen
// or moved to by that token that still has room, else dropped). Sequences
// never share loads, so the step splits into segments (a sequence's tokens
// from its first or from a group boundary on), placed in parallel, one
// thread each, each segment's assignments in order. A sequence's loads come
// in from `carried` (the group of the position before its first token) and
// go out to `carried_out` (the group of its last token); router r of the
// launch reads and writes columns column + r * E .. + E of its row.
// Dropless: everything kept, no loads read or written. Device memory.
struct SequenceScope {
  const int32_t* segment_first = nullptr;  // [segments] first token of each
  const int32_t* segment_count = nullptr;  // [segments] its tokens
  int segments = 0;
  int group_size = 1;
  const int32_t* positions = nullptr;       // [T]
  const int32_t* token_sequence = nullptr;  // [T]
  const int32_t* carried = nullptr;         // [S, stride]
  int32_t* carried_out = nullptr;           // [S, stride]
  int64_t stride = 0;
  int64_t column = 0;
  int32_t* scratch_loads = nullptr;  // [routers, segments, E]
  uint8_t* scratch_taken = nullptr;  // [routers, segments, E]
};

// Device memory, written by the kernel.
struct DispatchPlanOutput {
  int32_t* trace_expert = nullptr;  // [T, k] the expert that processes it (the new one if moved)
  float* trace_gate = nullptr;     // [T, k] its gate weight (dropped: the weight it would have had)
  uint8_t* trace_fate = nullptr;   // [T, k] DeviceFate
  int32_t* offsets = nullptr;      // [E + 1] expert e owns slots [offsets[e], offsets[e + 1])
  int32_t* slot_token = nullptr;   // [T * k] token of each slot
  float* slot_weight = nullptr;    // [T * k] gate weight of each slot
  int32_t* counts = nullptr;       // [4, E] routed, kept, rerouted, dropped
  double* prob_sum = nullptr;      // [E] sum over tokens of prob, in token order
  int32_t* assign_slot = nullptr;  // [T, k] slot of each assignment, -1 if dropped; may be null
};

// Dynamic shared memory of the launch's blocks: per-warp counts and the
// running figures of every expert, 4 * (15 E + 1) bytes. Past 48 KiB the
// launch opts in to more; past the device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin) it fails.
size_t DispatchPlanSharedBytes(int n_experts);

cudaError_t LaunchDispatchPlan(const DispatchPlanInput& in, const DispatchPlanOutput& out,
                               cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_DISPATCH_PLAN_H_
