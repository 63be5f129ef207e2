// The small per-token kernels of a CUDA backend step: the embedding lookup,
// RoPE with the KV cache append, the E = 1 output gate, gathering rows, the
// dense value weights of destination value routing, and the gate-weighted
// combine of routed expert outputs. Each is the CPU backend's operation of
// the same name (kernels/cpu/), one thread block per token, so no token's
// result depends on another's.
#ifndef SWITCHSERVE_KERNELS_CUDA_STEP_OPS_H_
#define SWITCHSERVE_KERNELS_CUDA_STEP_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/linear.h"

namespace switchserve::cuda {

// Element type of the KV cache: bf16, or f32 (the f32 weight mode).
enum class CacheType : int { kBf16, kF32 };

// x[t, :] = table[tokens[t], :] for t < tokens, widened to f32; table rows
// are d elements of `type`.
cudaError_t LaunchEmbed(const int32_t* token_ids, int tokens, const void* table, WeightType type,
                        int d, float* x, cudaStream_t stream);

// Rotate-half RoPE at each token's position on the first n_rot channels of
// every head (cos/sin tabulated per position, [positions, n_rot / 2], the
// CPU's RopeTable), then the cache append:
//   q[t, h * head_dim + i]        rotated in place, h < q_heads
//   k[t, g * head_dim + i]        rotated, written to k_cache row cache_rows[t]
//                                 (kv_heads * head_dim elements a row)
//   v[t, 0 .. v_cols)             written to v_cache row cache_rows[t]
// q, k and v rows are q_ld, k_ld and v_ld floats apart.
struct RopeAppendArgs {
  float* q = nullptr;
  int64_t q_ld = 0;
  int q_heads = 0;
  const float* k = nullptr;
  int64_t k_ld = 0;
  const float* v = nullptr;
  int64_t v_ld = 0;
  int kv_heads = 0;
  int v_cols = 0;
  int head_dim = 0;
  int n_rot = 0;  // 0: no rotation
  const float* cos = nullptr;
  const float* sin = nullptr;
  const int32_t* positions = nullptr;
  const int64_t* cache_rows = nullptr;
  int tokens = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  CacheType cache_type = CacheType::kBf16;
};
cudaError_t LaunchRopeAppend(const RopeAppendArgs& args, cudaStream_t stream);

// The E = 1 SwitchHead output gate: a[t, h * head_dim + i] *=
// sigmoid(logits[t * heads + h]).
cudaError_t LaunchHeadGate(const float* logits, int tokens, int heads, int head_dim, float* a,
                           cudaStream_t stream);

// dst[r, :] = src[rows[r], :] for r < n_rows; width floats per row.
cudaError_t LaunchGatherRows(const float* src, int64_t src_ld, const int32_t* rows, int n_rows,
                             int width, float* dst, int64_t dst_ld, cudaStream_t stream);

// One router module's kept assignments (dispatch_plan.h outputs), per router
// r in [0, routers): trace_gate[r][t * k + i] (the weight applied) and
// assign_slot[r][t * k + i] (-1: dropped), rank order per token.
struct Assignments {
  const float* gate = nullptr;
  const int32_t* slot = nullptr;
  int64_t router_stride = 0;  // elements between routers: T * k
  int top_k = 0;
};

// Destination value routing: weights[t, g, e] = the gate of token t's kept
// assignment to expert e of KV head g (router shared ? 0 : g), else 0;
// trace_expert is the dispatch's [routers][T, k] final expert.
cudaError_t LaunchValueWeights(const int32_t* trace_expert, const Assignments& assignments,
                               int tokens, int kv_heads, int n_experts, bool shared_router,
                               float* weights, cudaStream_t stream);

// The gate-weighted sum of routed expert outputs, per token in a fixed order
// (heads ascending, then the token's choices in rank order; dropped ones
// skipped). prod holds each head's expert outputs in slot order:
// prod[(h * slot_stride + slot) * prod_ld + c].
//   per_head   out[t, h * width + c] = sum_i gate * prod       (values, h < heads)
//   otherwise  out[t, c] (+)= sum_h sum_i gate * prod          (outputs)
// Router of head h: shared_router ? 0 : h.
struct CombineArgs {
  Assignments assignments;
  int tokens = 0;
  int heads = 1;
  bool shared_router = false;
  bool per_head = false;
  const float* prod = nullptr;
  int64_t prod_ld = 0;
  int64_t slot_stride = 0;
  int width = 0;
  float* out = nullptr;
  int64_t out_ld = 0;
  bool accumulate = false;
};
cudaError_t LaunchCombine(const CombineArgs& args, cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_STEP_OPS_H_
