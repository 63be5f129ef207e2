// Widening cache and weight values (f32, bf16, f16) to f32 in kernels, exact
// for every format: one value at a time, or the 16 bytes of one vector load
// (4 floats or 8 halves, in memory order). Included by .cu sources after
// kernels/cuda/simt.h.
#ifndef SWITCHSERVE_KERNELS_CUDA_WIDEN_H_
#define SWITCHSERVE_KERNELS_CUDA_WIDEN_H_

#include <cstdint>

#include "kernels/cuda/simt.h"

namespace switchserve::cuda {

__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }

// A 16-bit value of type WT from its bits.
__device__ __forceinline__ float WidenBits(uint16_t bits, const __nv_bfloat16*) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}
__device__ __forceinline__ float WidenBits(uint16_t bits, const __half*) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// The values of type WT that the 16 bytes `q` hold, widened into v[0, 16 /
// sizeof(WT)).
template <typename WT>
__device__ __forceinline__ void WidenWords(const uint4& q, float* v) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  if constexpr (sizeof(WT) == 4) {
    SIMT_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(words[i]);
  } else {
    SIMT_UNROLL
    for (int i = 0; i < 4; ++i) {
      v[2 * i] =
          WidenBits(static_cast<uint16_t>(words[i] & 0xffffu), static_cast<const WT*>(nullptr));
      v[2 * i + 1] =
          WidenBits(static_cast<uint16_t>(words[i] >> 16), static_cast<const WT*>(nullptr));
    }
  }
}

// One 16-byte load from p (16-byte aligned), widened into v.
template <typename WT>
__device__ __forceinline__ void WidenVector(const WT* p, float* v) {
  WidenWords<WT>(*reinterpret_cast<const uint4*>(p), v);
}

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_WIDEN_H_
