// Block-wide reductions for kernels whose block size is a multiple of 32:
// a butterfly within each warp, the warp totals through shared memory, and
// warp 0 reducing those. Every thread of the block calls them (they contain
// __syncthreads) and every thread gets the same total. Include after simt.h.
#ifndef SWITCHSERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_
#define SWITCHSERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_

#include "kernels/cuda/simt.h"

namespace switchserve::cuda {

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
  for (int offset = simt::kWarp / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(simt::kFullMask, v, offset));
  }
  return v;
}

// `scratch` is __shared__ T[32], free for this call; `identity` is the
// value op ignores (0 for a sum, -inf for a max). T: float, or double for a
// sum.
template <typename T, typename Op>
__device__ __forceinline__ T BlockReduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x % simt::kWarp;
  const int warp = threadIdx.x / simt::kWarp;
  const int n_warps = blockDim.x / simt::kWarp;
  v = WarpReduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = WarpReduce(lane < n_warps ? scratch[lane] : identity, op);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const T total = scratch[0];
  __syncthreads();  // scratch is free again when the call returns
  return total;
}

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_BLOCK_REDUCE_CUH_
