// The one header every CUDA source (.cu) of switchserve includes, instead of
// any CUDA header of its own. It makes one source build with two compilers:
//
//   nvcc        CUDA as it is: the toolkit's headers, `<<<...>>>` launches.
//   g++ -x c++  the SIMT executor (simt_device.h): kernels run on the CPU,
//               32-lane warps, a block's threads as fibers, blocks in parallel
//               on host threads, the CUDA runtime API on tracked host memory.
//
// What a kernel source writes, the same for both:
//   __global__/__device__/__host__/__forceinline__/__launch_bounds__,
//   threadIdx, blockIdx, blockDim, gridDim, __syncthreads, the *_sync warp
//   intrinsics with the full mask, atomics, <cmath> and the fast-math
//   intrinsics, __nv_bfloat16 / __half (the toolkit's cuda_bf16.h / cuda_fp16.h);
//   SIMT_SHARED(T, name, N) for a shared array T name[N] (not `__shared__`);
//   SIMT_DYNAMIC_SHARED(T, name) for the launch's dynamic shared memory;
//   SIMT_LAUNCH(kernel, grid, block, shared_bytes, stream, args...) for every
//   launch (returns the cudaError_t of cudaGetLastError() after the launch).
// The rules that keep one source right on both are in kernels/cuda/README.md.
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace simt {

// A warp is 32 lanes on every NVIDIA GPU switchserve targets; kernels write
// kWarp, never warpSize (which is not a constant expression).
inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

}  // namespace simt

#if defined(__CUDACC__)

// A shared array of `count` elements of `type`, one per block. Index it; do not
// take sizeof (it is a pointer on the executor).
#define SIMT_SHARED(type, name, count) __shared__ type name[count]

// The dynamic shared memory of a launch, viewed as T[]. One untyped extern
// array per translation unit, so kernels may view it as different types.
#define SIMT_DYNAMIC_SHARED(type, name)                                        \
  extern __shared__ __align__(16) unsigned char simt_dynamic_shared_memory_[]; \
  type* name = reinterpret_cast<type*>(simt_dynamic_shared_memory_)

namespace simt {

// Launches `kernel` with `<<<grid, block, shared_bytes, stream>>>`; `name` is
// used by the executor's diagnostics only.
template <typename... Params, typename... Args>
inline cudaError_t Launch(const char* /*name*/, void (*kernel)(Params...), dim3 grid, dim3 block,
                          size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
  kernel<<<grid, block, shared_bytes, stream>>>(static_cast<Params>(args)...);
  return cudaGetLastError();
}

}  // namespace simt

#else  // g++: the SIMT executor

#include "kernels/cuda/simt_device.h"

#endif  // __CUDACC__

// `#pragma unroll` for nvcc (g++ does not know it): SIMT_UNROLL before a loop.
#if defined(__CUDACC__)
#define SIMT_UNROLL _Pragma("unroll")
#else
#define SIMT_UNROLL
#endif

// A template kernel whose arguments contain a comma is passed in parentheses:
// SIMT_LAUNCH((Kernel<float, 4>), grid, block, 0, stream, x, y).
#define SIMT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::simt::Launch(#kernel, kernel, grid, block, shared_bytes, stream __VA_OPT__(, ) __VA_ARGS__)

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_H_
