// Per-token kernels of a step: one block per token (or per row), threads
// across the row. Nothing here reduces across threads, so a token's result is
// the same whatever the block size.
#include "kernels/cuda/simt.h"
#include "kernels/cuda/step_ops.h"

namespace switchserve::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float Load(const void* table, WeightType type, int64_t i) {
  switch (type) {
    case WeightType::kBf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(table)[i]);
    case WeightType::kF16:
      return __half2float(static_cast<const __half*>(table)[i]);
    case WeightType::kF32:
      break;
  }
  return static_cast<const float*>(table)[i];
}

__global__ void __launch_bounds__(kThreads)
    EmbedKernel(const int32_t* token_ids, const void* table, WeightType type, int d, float* x) {
  SIMT_GRID_WAIT();
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(token_ids[t]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) x[t * d + i] = Load(table, type, row + i);
}

template <typename CacheT>
__device__ __forceinline__ CacheT ToCache(float v);
template <>
__device__ __forceinline__ float ToCache<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 ToCache<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Rotates channels [0, n_rot) of the head vector at `x` (rotate-half), as
// cpu::RopeTable::Apply: pair (i, i + half) for i < half.
__device__ __forceinline__ void RotatePair(const float* x, int i, int half, const float* c,
                                           const float* s, float* first, float* second) {
  const float a = x[i];
  const float b = x[i + half];
  *first = a * c[i] - b * s[i];
  *second = b * c[i] + a * s[i];
}

template <typename CacheT>
__global__ void __launch_bounds__(kThreads)
    RopeAppendKernel(float* q, int64_t q_ld, int q_heads, const float* k, int64_t k_ld,
                     const float* v, int64_t v_ld, int kv_heads, int v_cols, int head_dim,
                     int n_rot, const float* cos_table, const float* sin_table,
                     const int32_t* positions, const int64_t* cache_rows, CacheT* k_cache,
                     CacheT* v_cache) {
  SIMT_GRID_WAIT();
  const int64_t t = blockIdx.x;
  const int half = n_rot / 2;
  const float* c = cos_table + static_cast<int64_t>(positions[t]) * half;
  const float* s = sin_table + static_cast<int64_t>(positions[t]) * half;
  // q in place: each pair is read and written by the same thread.
  float* qt = q + t * q_ld;
  for (int idx = threadIdx.x; idx < q_heads * half; idx += blockDim.x) {
    float* head = qt + static_cast<int64_t>(idx / half) * head_dim;
    const int i = idx % half;
    float first, second;
    RotatePair(head, i, half, c, s, &first, &second);
    head[i] = first;
    head[i + half] = second;
  }
  const int64_t row = cache_rows[t];
  const int64_t k_width = static_cast<int64_t>(kv_heads) * head_dim;
  const float* kt = k + t * k_ld;
  CacheT* kc = k_cache + row * k_width;
  for (int idx = threadIdx.x; idx < k_width; idx += blockDim.x) {
    const int i = idx % head_dim;
    const float* head = kt + (idx - i);
    float value = head[i];
    if (i < half) {
      float second;
      RotatePair(head, i, half, c, s, &value, &second);
    } else if (i < 2 * half) {
      float first;
      RotatePair(head, i - half, half, c, s, &first, &value);
    }
    kc[idx] = ToCache<CacheT>(value);
  }
  const float* vt = v + t * v_ld;
  CacheT* vc = v_cache + row * v_cols;
  for (int idx = threadIdx.x; idx < v_cols; idx += blockDim.x) vc[idx] = ToCache<CacheT>(vt[idx]);
}

__global__ void __launch_bounds__(kThreads)
    HeadGateKernel(const float* logits, int heads, int head_dim, float* a) {
  SIMT_GRID_WAIT();
  const int64_t t = blockIdx.x;
  for (int idx = threadIdx.x; idx < heads * head_dim; idx += blockDim.x) {
    const float z = logits[t * heads + idx / head_dim];
    a[t * heads * head_dim + idx] *= 1.0f / (1.0f + expf(-z));
  }
}

__global__ void __launch_bounds__(kThreads)
    GatherRowsKernel(const float* src, int64_t src_ld, const int32_t* rows, int width, float* dst,
                     int64_t dst_ld) {
  SIMT_GRID_WAIT();
  const int64_t r = blockIdx.x;
  const float* from = src + static_cast<int64_t>(rows[r]) * src_ld;
  for (int i = threadIdx.x; i < width; i += blockDim.x) dst[r * dst_ld + i] = from[i];
}

__global__ void __launch_bounds__(kThreads)
    ValueWeightsKernel(const int32_t* trace_expert, const float* gate, const int32_t* slot,
                       int64_t router_stride, int top_k, int kv_heads, int n_experts,
                       int shared_router, float* weights) {
  SIMT_GRID_WAIT();
  const int64_t t = blockIdx.x;
  float* row = weights + t * kv_heads * n_experts;
  // One thread per KV head writes its E weights: zeros, then each kept choice.
  for (int g = threadIdx.x; g < kv_heads; g += blockDim.x) {
    const int64_t base = (shared_router != 0 ? 0 : g) * router_stride + t * top_k;
    for (int e = 0; e < n_experts; ++e) row[g * n_experts + e] = 0.0f;
    for (int i = 0; i < top_k; ++i) {
      if (slot[base + i] < 0) continue;
      row[g * n_experts + trace_expert[base + i]] = gate[base + i];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    CombineKernel(const float* gate, const int32_t* slot, int64_t router_stride, int top_k,
                  int heads, int shared_router, int per_head, const float* prod, int64_t prod_ld,
                  int64_t slot_stride, int width, float* out, int64_t out_ld, int accumulate) {
  SIMT_GRID_WAIT();
  const int64_t t = blockIdx.x;
  const int first = blockIdx.y * blockDim.x + threadIdx.x;  // columns spread over gridDim.y
  const int stride = gridDim.y * blockDim.x;
  if (per_head != 0) {
    for (int idx = first; idx < heads * width; idx += stride) {
      const int h = idx / width;
      const int c = idx % width;
      const int64_t base = (shared_router != 0 ? 0 : h) * router_stride + t * top_k;
      float sum = 0.0f;
      for (int i = 0; i < top_k; ++i) {
        const int32_t s = slot[base + i];
        if (s < 0) continue;
        sum = fmaf(gate[base + i], prod[(h * slot_stride + s) * prod_ld + c], sum);
      }
      float* o = out + t * out_ld + idx;
      *o = accumulate != 0 ? *o + sum : sum;
    }
    return;
  }
  for (int c = first; c < width; c += stride) {
    float sum = 0.0f;
    for (int h = 0; h < heads; ++h) {
      const int64_t base = (shared_router != 0 ? 0 : h) * router_stride + t * top_k;
      for (int i = 0; i < top_k; ++i) {
        const int32_t s = slot[base + i];
        if (s < 0) continue;
        sum = fmaf(gate[base + i], prod[(h * slot_stride + s) * prod_ld + c], sum);
      }
    }
    float* o = out + t * out_ld + c;
    *o = accumulate != 0 ? *o + sum : sum;
  }
}

}  // namespace

cudaError_t LaunchEmbed(const int32_t* token_ids, int tokens, const void* table, WeightType type,
                        int d, float* x, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return SIMT_LAUNCH_DEPENDENT(EmbedKernel, dim3(tokens), dim3(kThreads), 0, stream, token_ids,
                               table, type, d, x);
}

cudaError_t LaunchRopeAppend(const RopeAppendArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  if (a.n_rot % 2 != 0 || a.n_rot > a.head_dim) return cudaErrorInvalidValue;
  if (a.cache_type == CacheType::kBf16) {
    return SIMT_LAUNCH_DEPENDENT(RopeAppendKernel<__nv_bfloat16>, dim3(a.tokens), dim3(kThreads), 0,
                                 stream, a.q, a.q_ld, a.q_heads, a.k, a.k_ld, a.v, a.v_ld,
                                 a.kv_heads, a.v_cols, a.head_dim, a.n_rot, a.cos, a.sin,
                                 a.positions, a.cache_rows, static_cast<__nv_bfloat16*>(a.k_cache),
                                 static_cast<__nv_bfloat16*>(a.v_cache));
  }
  return SIMT_LAUNCH_DEPENDENT(
      RopeAppendKernel<float>, dim3(a.tokens), dim3(kThreads), 0, stream, a.q, a.q_ld, a.q_heads,
      a.k, a.k_ld, a.v, a.v_ld, a.kv_heads, a.v_cols, a.head_dim, a.n_rot, a.cos, a.sin,
      a.positions, a.cache_rows, static_cast<float*>(a.k_cache), static_cast<float*>(a.v_cache));
}

cudaError_t LaunchHeadGate(const float* logits, int tokens, int heads, int head_dim, float* a,
                           cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return SIMT_LAUNCH_DEPENDENT(HeadGateKernel, dim3(tokens), dim3(kThreads), 0, stream, logits,
                               heads, head_dim, a);
}

cudaError_t LaunchGatherRows(const float* src, int64_t src_ld, const int32_t* rows, int n_rows,
                             int width, float* dst, int64_t dst_ld, cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  return SIMT_LAUNCH_DEPENDENT(GatherRowsKernel, dim3(n_rows), dim3(kThreads), 0, stream, src,
                               src_ld, rows, width, dst, dst_ld);
}

cudaError_t LaunchValueWeights(const int32_t* trace_expert, const Assignments& as, int tokens,
                               int kv_heads, int n_experts, bool shared_router, float* weights,
                               cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return SIMT_LAUNCH_DEPENDENT(ValueWeightsKernel, dim3(tokens), dim3(kThreads), 0, stream,
                               trace_expert, as.gate, as.slot, as.router_stride, as.top_k, kv_heads,
                               n_experts, shared_router ? 1 : 0, weights);
}

cudaError_t LaunchCombine(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return cudaSuccess;
  const int columns = a.per_head ? a.heads * a.width : a.width;
  if (columns == 0) return cudaSuccess;
  const dim3 grid(a.tokens, (columns + kThreads - 1) / kThreads);
  return SIMT_LAUNCH_DEPENDENT(CombineKernel, grid, dim3(kThreads), 0, stream, a.assignments.gate,
                               a.assignments.slot, a.assignments.router_stride, a.assignments.top_k,
                               a.heads, a.shared_router ? 1 : 0, a.per_head ? 1 : 0, a.prod,
                               a.prod_ld, a.slot_stride, a.width, a.out, a.out_ld,
                               a.accumulate ? 1 : 0);
}

}  // namespace switchserve::cuda
