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
//   launch (returns the cudaError_t of cudaGetLastError() after the launch);
//   SIMT_LAUNCH_DEPENDENT(...) the same, for a kernel whose first statement
//   is SIMT_GRID_WAIT() (below).
// The rules that keep one source right on both are in kernels/cuda/README.md.
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/dependent_launch.h"

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

// Dependent launch (programmatic dependent launch, sm_90 and later): a kernel
// launched with SIMT_LAUNCH_DEPENDENT, where the policy of dependent_launch.h
// asks for it, may be scheduled while the kernel ahead of it in its stream is
// still running, so that its launch overlaps that kernel's tail.
// SIMT_GRID_WAIT(), its first statement, blocks until that kernel has
// completed and its writes are visible (griddepcontrol.wait), then allows the
// next kernel to be scheduled in turn (launch_dependents). Every kernel waits
// for its predecessor, so the chain stays in stream order. Code compiled for
// an older architecture has no wait, so it is never launched this way.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SIMT_GRID_WAIT() \
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define SIMT_GRID_WAIT() \
  do {                   \
  } while (false)
#endif

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

// Whether this thread's launch of `kernel` is dependent: the scope asks for
// it (dependent_launch.h), SWITCHSERVE_CUDA_DEPENDENT_LAUNCH is not 0, the
// device has dependent launches and the code that runs was compiled for
// sm_90 or later (where SIMT_GRID_WAIT() waits: not sm_80 code, nor its PTX
// compiled for a newer GPU). All but the scope is decided once, at the first
// launch through here whatever its scope, for the current device and that
// kernel (switchserve's kernels are all compiled for the same architectures);
// the queries are no stream work, so they may run inside a graph capture.
inline bool DependentLaunchEnabled(const void* kernel) {
  static const bool available = [kernel] {
    const char* env = std::getenv("SWITCHSERVE_CUDA_DEPENDENT_LAUNCH");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    int device = 0, major = 0;
    cudaFuncAttributes code{};
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major >= 9 && cudaFuncGetAttributes(&code, kernel) == cudaSuccess &&
           code.ptxVersion >= 90;
  }();
  return available && DependentLaunchRequested();
}

// Launches `kernel`, which begins with SIMT_GRID_WAIT(), as a dependent launch
// where DependentLaunchEnabled(kernel), as Launch otherwise.
template <typename... Params, typename... Args>
inline cudaError_t LaunchDependent(const char* name, void (*kernel)(Params...), dim3 grid,
                                   dim3 block, size_t shared_bytes, cudaStream_t stream,
                                   Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
  if (!DependentLaunchEnabled(reinterpret_cast<const void*>(kernel))) {
    return Launch(name, kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  return e != cudaSuccess ? e : cudaGetLastError();
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
#define SIMT_LAUNCH_DEPENDENT(kernel, grid, block, shared_bytes, stream, ...) \
  ::simt::LaunchDependent(#kernel, kernel, grid, block, shared_bytes,         \
                          stream __VA_OPT__(, ) __VA_ARGS__)

namespace simt {

// Dynamic shared memory a launch may take without its kernel's opt-in.
inline constexpr size_t kDefaultDynamicSharedBytes = 48 * 1024;

// Opts `kernel` in to `bytes` of dynamic shared memory where that is more
// than kDefaultDynamicSharedBytes (past the device's opt-in limit it fails).
template <typename Kernel>
inline cudaError_t AllowDynamicShared(Kernel* kernel, size_t bytes) {
  if (bytes <= kDefaultDynamicSharedBytes) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

}  // namespace simt

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_H_
