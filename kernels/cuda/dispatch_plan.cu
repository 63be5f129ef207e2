// Capacity dispatch of one router's step: one block of kThreads threads.
#include <cmath>

#include "kernels/cuda/dispatch_plan.h"
#include "kernels/cuda/simt.h"

namespace switchserve::cuda {
namespace {

using simt::kFullMask;
using simt::kWarp;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

__device__ __forceinline__ unsigned LanesBelow(int lane) { return (1u << lane) - 1u; }

// The stable position of this thread's assignment (key = its expert, or -1
// for none) among the assignments of the same key before it: base[key] from
// earlier chunks, the same-key lanes of earlier warps, the same-key lanes
// before it in its warp. Adds the chunk's counts to base. Every thread of the
// block calls it; warp_count is shared [kWarps, n_keys].
__device__ int ChunkPosition(int key, int n_keys, int* warp_count, int* base) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  for (int x = lane; x < n_keys; x += kWarp) warp_count[warp * n_keys + x] = 0;
  __syncwarp();
  const unsigned peers = __match_any_sync(kFullMask, key);
  const int rank = __popc(peers & LanesBelow(lane));
  if (key >= 0 && rank == 0) warp_count[warp * n_keys + key] = __popc(peers);
  __syncthreads();
  int pos = 0;
  if (key >= 0) {
    pos = base[key] + rank;
    for (int w = 0; w < warp; ++w) pos += warp_count[w * n_keys + key];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < n_keys; x += blockDim.x) {
    int total = 0;
    for (int w = 0; w < kWarps; ++w) total += warp_count[w * n_keys + x];
    base[x] += total;
  }
  __syncthreads();
  return pos;
}

struct Plan {
  const int32_t* expert;
  const float* weight;
  const float* score;
  int64_t score_ld;
  int tokens;
  int top_k;
  int n_experts;
  int64_t capacity;
  int32_t* trace_expert;
  float* trace_gate;
  uint8_t* trace_fate;
};

// Has token t chosen expert x (any rank) or been moved to it (ranks < r)?
__device__ bool Taken(const Plan& p, int t, int r, int x) {
  const int64_t row = static_cast<int64_t>(t) * p.top_k;
  for (int q = 0; q < p.top_k; ++q) {
    if (p.expert[row + q] == x) return true;
  }
  for (int q = 0; q < r; ++q) {
    if (p.trace_fate[row + q] == static_cast<uint8_t>(DeviceFate::kRerouted) &&
        p.trace_expert[row + q] == x) {
      return true;
    }
  }
  return false;
}

// Reroute fates, by warp 0 alone; load[e] ends as the assignments expert e
// processes.
__device__ void RerouteFates(const Plan& p, int* load) {
  const int lane = threadIdx.x;
  const int n_assign = p.tokens * p.top_k;
  for (int a = 0; a < n_assign;) {
    const int ai = a + lane;
    const bool valid = ai < n_assign;
    const int t = valid ? ai % p.tokens : 0;
    const int64_t idx = static_cast<int64_t>(t) * p.top_k + (valid ? ai / p.tokens : 0);
    const int e = valid ? p.expert[idx] : -1;
    const unsigned peers = __match_any_sync(kFullMask, e);
    const int rank = __popc(peers & LanesBelow(lane));
    const bool overflow = valid && load[e] + rank >= p.capacity;
    const unsigned overflowing = __ballot_sync(kFullMask, overflow);
    const int n_valid = min(kWarp, n_assign - a);
    // Lanes before the first overflow are kept, each at load[e] + rank.
    const int commit = overflowing != 0 ? __ffs(static_cast<int>(overflowing)) - 1 : n_valid;
    const bool kept = lane < commit;
    __syncwarp();  // every lane has read load[] before it changes
    if (kept) {
      p.trace_expert[idx] = e;
      p.trace_gate[idx] = p.weight[idx];
      p.trace_fate[idx] = static_cast<uint8_t>(DeviceFate::kKept);
      const unsigned kept_peers = peers & (commit == kWarp ? kFullMask : (1u << commit) - 1u);
      if (__popc(kept_peers & LanesBelow(lane)) == 0) load[e] += __popc(kept_peers);
    }
    __syncwarp();
    if (commit == n_valid) {
      a += n_valid;
      continue;
    }
    // Assignment a + commit finds its expert full: the warp picks the token's
    // best remaining expert with room (highest logit, ties to the lower e).
    const int af = a + commit;
    const int tf = af % p.tokens;
    const int64_t f_idx = static_cast<int64_t>(tf) * p.top_k + af / p.tokens;
    int best = -1;
    float best_score = 0.0f;
    for (int x = lane; x < p.n_experts; x += kWarp) {
      if (load[x] >= p.capacity || Taken(p, tf, af / p.tokens, x)) continue;
      const float s = p.score[tf * p.score_ld + x];
      if (best < 0 || s > best_score) {
        best = x;
        best_score = s;
      }
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const int other = __shfl_xor_sync(kFullMask, best, offset);
      const float other_score = __shfl_xor_sync(kFullMask, best_score, offset);
      if (other >= 0 &&
          (best < 0 || other_score > best_score || (other_score == best_score && other < best))) {
        best = other;
        best_score = other_score;
      }
    }
    // That is the ascending scan's answer when the scores are ordered. A NaN
    // among them (no score replaces it once it is the best so far, and it
    // replaces none) leaves the choice to lane 0's scan, as on the CPU
    // (BestExpert): the NaN expert if it is the first with room.
    bool nan = false;
    for (int x = lane; x < p.n_experts; x += kWarp) {
      nan = nan || std::isnan(p.score[tf * p.score_ld + x]);
    }
    if (__any_sync(kFullMask, nan) && lane == 0) {
      best = -1;
      for (int x = 0; x < p.n_experts; ++x) {
        if (load[x] >= p.capacity || Taken(p, tf, af / p.tokens, x)) continue;
        if (best < 0 || p.score[tf * p.score_ld + x] > p.score[tf * p.score_ld + best]) best = x;
      }
    }
    if (lane == 0) {
      p.trace_gate[f_idx] = p.weight[f_idx];
      if (best >= 0) {
        p.trace_expert[f_idx] = best;
        p.trace_fate[f_idx] = static_cast<uint8_t>(DeviceFate::kRerouted);
        load[best] += 1;
      } else {
        p.trace_expert[f_idx] = p.expert[f_idx];
        p.trace_fate[f_idx] = static_cast<uint8_t>(DeviceFate::kDropped);
      }
    }
    __syncwarp();
    a = af + 1;
  }
}

// One assignment (token t, rank r) of the sequence scope against `load`,
// exactly as the CPU's Place: kept if its expert has room, else (reroute) the
// token's best expert by logit (ties to the lower index) neither chosen nor
// moved to by it that still has room, else dropped.
__device__ void SequencePlace(const Plan& p, int t, int r, bool reroute, int32_t* load,
                              uint8_t* taken) {
  const int64_t idx = static_cast<int64_t>(t) * p.top_k + r;
  const int e = p.expert[idx];
  p.trace_expert[idx] = e;
  p.trace_gate[idx] = p.weight[idx];
  if (load[e] < p.capacity) {
    p.trace_fate[idx] = static_cast<uint8_t>(DeviceFate::kKept);
    ++load[e];
    return;
  }
  if (reroute) {
    const float* score = p.score + t * p.score_ld;
    int target = -1;
    for (int x = 0; x < p.n_experts; ++x) {
      if (taken[x] != 0 || load[x] >= p.capacity) continue;
      if (target < 0 || score[x] > score[target]) target = x;
    }
    if (target >= 0) {
      taken[target] = 1;
      p.trace_expert[idx] = target;
      p.trace_fate[idx] = static_cast<uint8_t>(DeviceFate::kRerouted);
      ++load[target];
      return;
    }
  }
  p.trace_fate[idx] = static_cast<uint8_t>(DeviceFate::kDropped);
}

// The sequence scope's fates, one thread per segment (see dispatch_plan.h).
__device__ void SequenceFates(const Plan& p, DispatchMode mode, const int32_t* segment_first,
                              const int32_t* segment_count, int segments, int group_size,
                              const int32_t* positions, const int32_t* token_sequence,
                              const int32_t* carried, int32_t* carried_out, int64_t stride,
                              int64_t column, int32_t* scratch_loads, uint8_t* scratch_taken) {
  const int E = p.n_experts;
  const bool reroute = mode == DispatchMode::kReroute;
  for (int sg = threadIdx.x; sg < segments; sg += blockDim.x) {
    int32_t* load = scratch_loads + static_cast<int64_t>(sg) * E;
    uint8_t* taken = scratch_taken + static_cast<int64_t>(sg) * E;
    const int first = segment_first[sg];
    const int end = first + segment_count[sg];
    const int64_t row = static_cast<int64_t>(token_sequence[first]) * stride + column;
    for (int e = 0; e < E; ++e) load[e] = carried[row + e];
    for (int t = first; t < end; ++t) {
      if (positions[t] % group_size == 0) {
        for (int e = 0; e < E; ++e) load[e] = 0;
      }
      if (reroute) {
        for (int e = 0; e < E; ++e) taken[e] = 0;
        for (int r = 0; r < p.top_k; ++r)
          taken[p.expert[static_cast<int64_t>(t) * p.top_k + r]] = 1;
      }
      for (int r = 0; r < p.top_k; ++r) SequencePlace(p, t, r, reroute, load, taken);
    }
    // The sequence's last segment of the step leaves its loads behind.
    if (end == p.tokens || token_sequence[end] != token_sequence[first]) {
      for (int e = 0; e < E; ++e) carried_out[row + e] = load[e];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    DispatchPlanKernel(const int32_t* expert, const float* weight, const float* score,
                       int64_t score_ld, const float* prob, int tokens, int top_k, int n_experts,
                       int64_t capacity, DispatchMode mode, int64_t score_router_offset,
                       const int32_t* counted_tokens, int32_t* trace_expert, float* trace_gate,
                       uint8_t* trace_fate, int32_t* offsets, int32_t* slot_token,
                       float* slot_weight, int32_t* counts, double* prob_sum, int32_t* assign_slot,
                       const int32_t* segment_first, const int32_t* segment_count, int segments,
                       int group_size, const int32_t* positions, const int32_t* token_sequence,
                       const int32_t* carried, int32_t* carried_out, int64_t loads_stride,
                       int64_t loads_column, int32_t* scratch_loads, uint8_t* scratch_taken) {
  SIMT_GRID_WAIT();
  SIMT_DYNAMIC_SHARED(int, shared);
  const int E = n_experts;
  // This block's router.
  const int64_t router = blockIdx.x;
  const int64_t per_router = static_cast<int64_t>(tokens) * top_k;
  expert += router * per_router;
  weight += router * per_router;
  score += router * score_router_offset;
  prob += router * tokens * E;
  trace_expert += router * per_router;
  trace_gate += router * per_router;
  trace_fate += router * per_router;
  offsets += router * (E + 1);
  slot_token += router * per_router;
  slot_weight += router * per_router;
  counts += router * 4 * E;
  prob_sum += router * E;
  if (assign_slot != nullptr) assign_slot += router * per_router;
  const int counted = counted_tokens != nullptr ? *counted_tokens : tokens;
  const bool sequence = segment_first != nullptr;
  if (sequence) {
    loads_column += router * E;
    scratch_loads += router * segments * E;
    scratch_taken += router * segments * E;
  }
  int* warp_count = shared;             // [kWarps, E]
  int* base = warp_count + kWarps * E;  // [E] running counts of the counting passes
  int* load = base + E;                 // [E] assignments each expert processes
  int* offs = load + E;                 // [E + 1]
  int* stat = offs + E + 1;             // [4, E] routed, kept, rerouted, dropped
  const Plan p{expert,    weight,   score,        score_ld,   tokens,    top_k,
               n_experts, capacity, trace_expert, trace_gate, trace_fate};
  const int n_assign = tokens * top_k;
  for (int x = threadIdx.x; x < E; x += blockDim.x) base[x] = load[x] = 0;
  for (int x = threadIdx.x; x < 4 * E; x += blockDim.x) stat[x] = 0;
  __syncthreads();

  // 1. Fates: rank-major (a = r * T + t) in step scope; by sequence segment
  // in sequence scope.
  if (sequence && mode != DispatchMode::kForced) {
    if (mode == DispatchMode::kDropless) {
      for (int64_t idx = threadIdx.x; idx < n_assign; idx += blockDim.x) {
        trace_expert[idx] = expert[idx];
        trace_gate[idx] = weight[idx];
        trace_fate[idx] = static_cast<uint8_t>(DeviceFate::kKept);
      }
    } else {
      SequenceFates(p, mode, segment_first, segment_count, segments, group_size, positions,
                    token_sequence, carried, carried_out, loads_stride, loads_column, scratch_loads,
                    scratch_taken);
    }
    __syncthreads();
    for (int a = threadIdx.x; a < n_assign; a += blockDim.x) {
      if (trace_fate[a] != static_cast<uint8_t>(DeviceFate::kDropped)) {
        atomicAdd(&load[trace_expert[a]], 1);  // a count: the order does not matter
      }
    }
  } else if (mode == DispatchMode::kForced) {
    for (int a = threadIdx.x; a < n_assign; a += blockDim.x) {
      const int64_t idx = static_cast<int64_t>(a % tokens) * top_k + a / tokens;
      if (trace_fate[idx] != static_cast<uint8_t>(DeviceFate::kDropped)) {
        atomicAdd(&load[trace_expert[idx]], 1);  // a count: the order does not matter
      }
    }
  } else if (mode == DispatchMode::kReroute) {
    if (threadIdx.x < kWarp) RerouteFates(p, load);
  } else {
    for (int chunk = 0; chunk < n_assign; chunk += blockDim.x) {
      const int a = chunk + threadIdx.x;
      const bool valid = a < n_assign;
      const int64_t idx = valid ? static_cast<int64_t>(a % tokens) * top_k + a / tokens : 0;
      const int e = valid ? expert[idx] : -1;
      const int pos = ChunkPosition(e, E, warp_count, base);
      if (valid) {
        const bool kept = mode == DispatchMode::kDropless || pos < capacity;
        trace_expert[idx] = e;
        trace_gate[idx] = weight[idx];
        trace_fate[idx] = static_cast<uint8_t>(kept ? DeviceFate::kKept : DeviceFate::kDropped);
      }
    }
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
      load[x] = mode == DispatchMode::kDropless
                    ? base[x]
                    : static_cast<int>(
                          min(static_cast<long long>(base[x]), static_cast<long long>(capacity)));
    }
  }
  __syncthreads();

  // 2. Offsets of each expert's slots.
  if (threadIdx.x == 0) {
    int total = 0;
    for (int x = 0; x < E; ++x) {
      offs[x] = total;
      total += load[x];
    }
    offs[E] = total;
  }
  for (int x = threadIdx.x; x < E; x += blockDim.x) base[x] = 0;
  __syncthreads();
  for (int x = threadIdx.x; x <= E; x += blockDim.x) offsets[x] = offs[x];

  // 3. Slots: processed assignments by final expert, stable in fill order (a
  // = r * T + t in step scope, t * k + r in sequence scope); statistics.
  for (int chunk = 0; chunk < n_assign; chunk += blockDim.x) {
    const int a = chunk + threadIdx.x;
    const bool valid = a < n_assign;
    const int t = valid ? (sequence ? a / top_k : a % tokens) : 0;
    const int64_t idx =
        valid ? static_cast<int64_t>(t) * top_k + (sequence ? a % top_k : a / tokens) : 0;
    const uint8_t fate = valid ? trace_fate[idx] : static_cast<uint8_t>(DeviceFate::kDropped);
    const bool processed = fate != static_cast<uint8_t>(DeviceFate::kDropped);
    const int final_expert = processed ? trace_expert[idx] : -1;
    const int pos = ChunkPosition(final_expert, E, warp_count, base);
    if (!valid) continue;
    const int slot = processed ? offs[final_expert] + pos : -1;
    if (processed) {
      slot_token[slot] = t;
      slot_weight[slot] = trace_gate[idx];
    }
    if (assign_slot != nullptr) assign_slot[idx] = slot;
    if (t >= counted) continue;
    // Forced: kept and dropped assignments name the expert they were routed
    // to; a rerouted one's original choice is taken from this top-k.
    const int routed_to =
        mode == DispatchMode::kForced && fate != static_cast<uint8_t>(DeviceFate::kRerouted)
            ? trace_expert[idx]
            : expert[idx];
    atomicAdd(&stat[routed_to], 1);
    if (fate == static_cast<uint8_t>(DeviceFate::kKept)) atomicAdd(&stat[E + routed_to], 1);
    if (fate == static_cast<uint8_t>(DeviceFate::kRerouted)) {
      atomicAdd(&stat[2 * E + routed_to], 1);
      atomicAdd(&stat[E + final_expert], 1);
    }
    if (fate == static_cast<uint8_t>(DeviceFate::kDropped)) atomicAdd(&stat[3 * E + routed_to], 1);
  }
  __syncthreads();
  for (int x = threadIdx.x; x < 4 * E; x += blockDim.x) counts[x] = stat[x];
  // prob_sum in token order, as the CPU adds it.
  for (int x = threadIdx.x; x < E; x += blockDim.x) {
    double sum = 0;
    for (int t = 0; t < counted; ++t) sum += prob[static_cast<int64_t>(t) * E + x];
    prob_sum[x] = sum;
  }
}

}  // namespace

size_t DispatchPlanSharedBytes(int n_experts) {
  // warp_count [kWarps, E], base, load, offs [E + 1], stat [4, E].
  return sizeof(int) * (static_cast<size_t>(kWarps + 7) * n_experts + 1);
}

cudaError_t LaunchDispatchPlan(const DispatchPlanInput& in, const DispatchPlanOutput& out,
                               cudaStream_t stream) {
  if (in.n_experts < 1 || in.top_k < 1 || in.top_k > in.n_experts || in.tokens < 0 ||
      in.capacity < 0 || in.routers < 1) {
    return cudaErrorInvalidValue;
  }
  const size_t shared_bytes = DispatchPlanSharedBytes(in.n_experts);
  if (const cudaError_t e = simt::AllowDynamicShared(DispatchPlanKernel, shared_bytes);
      e != cudaSuccess) {
    return e;
  }
  const SequenceScope none;
  const SequenceScope& q = in.sequence != nullptr ? *in.sequence : none;
  if (in.sequence != nullptr &&
      (q.segment_first == nullptr || q.segment_count == nullptr || q.group_size < 1 ||
       q.positions == nullptr || q.token_sequence == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return SIMT_LAUNCH_DEPENDENT(
      DispatchPlanKernel, dim3(in.routers), dim3(kThreads), shared_bytes, stream, in.expert,
      in.weight, in.score, in.score_ld, in.prob, in.tokens, in.top_k, in.n_experts, in.capacity,
      in.mode, in.score_router_offset, in.counted_tokens, out.trace_expert, out.trace_gate,
      out.trace_fate, out.offsets, out.slot_token, out.slot_weight, out.counts, out.prob_sum,
      out.assign_slot, q.segment_first, q.segment_count, q.segments, q.group_size, q.positions,
      q.token_sequence, q.carried, q.carried_out, q.stride, q.column, q.scratch_loads,
      q.scratch_taken);
}

}  // namespace switchserve::cuda
