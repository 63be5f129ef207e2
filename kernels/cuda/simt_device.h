// CUDA's kernel vocabulary for g++, on the SIMT executor. Included by simt.h
// only, after the toolkit's headers (which, compiled by a host compiler, define
// __global__, __device__, __host__ and __shared__ as nothing); never by a .cu
// file directly.
//
// How each piece maps:
//   __global__/__device__/__host__  plain functions (the toolkit's definitions).
//   SIMT_SHARED(T, name, count)     per-block storage from the executor, fresh
//                                   for every block and filled with 0xff bytes;
//                                   plain `__shared__` is a compile error (see
//                                   kernels/cuda/README.md for why).
//   threadIdx/blockIdx/...          thread_local globals the executor sets
//                                   before it switches to a fiber.
//   __syncthreads, warp intrinsics  calls into the executor (simt_executor.cc),
//                                   which suspend the calling fiber.
//   atomics                         std::atomic_ref: blocks run in parallel.
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_DEVICE_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_DEVICE_H_

#if defined(__CUDACC__)
#error "simt_device.h is the g++ side of simt.h; include kernels/cuda/simt.h"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>
#include <typeinfo>
#include <utility>

// A `static thread_local` would isolate concurrent blocks (a host thread runs
// one block at a time) but outlive the block: the next block on that thread,
// or the rerun of a test under another thread order, would read the values
// the last one left, hiding exactly the missing barriers the executor exists
// to find. So kernels declare shared arrays with SIMT_SHARED.
#undef __shared__
#define __shared__ \
  static_assert(false, "declare shared memory with SIMT_SHARED(type, name, count) (simt.h)");
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __noinline__
#define __noinline__ __attribute__((noinline))

// The built-in index variables: per fiber, as the executor sets them.
extern thread_local constinit uint3 threadIdx;
extern thread_local constinit uint3 blockIdx;
extern thread_local constinit dim3 blockDim;
extern thread_local constinit dim3 gridDim;

namespace simt::detail {

enum class WarpOp : uint8_t {
  kSyncWarp,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAll,
  kAny,
  kMatchAny,
};
enum class BarrierOp : uint8_t { kSync, kCount, kAnd, kOr };

// Entry points into the executor; each suspends the calling fiber until its
// block (barrier) or warp (the rest) has arrived. `site` is the barrier's
// place in the source: every thread of a block must wait at the same one.
int BlockBarrier(BarrierOp op, int predicate, const std::source_location& site);
uint64_t WarpExchange(WarpOp op, unsigned mask, uint64_t bits, int bytes, int arg, int width);
void* DynamicShared();
// The block's instance of the shared array declared at `site` (one per
// declaration, the same for every thread of the block).
void* StaticShared(const void* site, size_t bytes, size_t alignment);

template <typename T>
inline uint64_t ToBits(T value) {
  static_assert(std::is_trivially_copyable_v<T> &&
                    (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8),
                "warp intrinsics move 1-, 2-, 4- or 8-byte trivially copyable values");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <typename T>
inline T FromBits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace simt::detail

#define SIMT_DYNAMIC_SHARED(type, name) \
  type* name = reinterpret_cast<type*>(::simt::detail::DynamicShared())
#define SIMT_SHARED(type, name, count)                                \
  static constexpr char simt_shared_site_##name = 0;                  \
  type* const name = static_cast<type*>(::simt::detail::StaticShared( \
      &simt_shared_site_##name, sizeof(type) * static_cast<size_t>(count), alignof(type)))

// ---- Synchronisation ----------------------------------------------------

namespace simt::detail {
// SIMT_GRID_WAIT: launches run one after another here, so there is nothing to
// wait for; the executor records the call and fails a dependent launch whose
// thread reaches shared memory, a barrier, a warp intrinsic or its end first.
void GridWait();
}  // namespace simt::detail
#define SIMT_GRID_WAIT() ::simt::detail::GridWait()

// Each barrier knows its call site (the default argument is evaluated where
// the kernel calls it): two different barriers reached by the two sides of a
// divergent branch are reported, as they are undefined on a GPU.
inline void __syncthreads(std::source_location site = std::source_location::current()) {
  simt::detail::BlockBarrier(simt::detail::BarrierOp::kSync, 0, site);
}
inline int __syncthreads_count(int predicate,
                               std::source_location site = std::source_location::current()) {
  return simt::detail::BlockBarrier(simt::detail::BarrierOp::kCount, predicate, site);
}
inline int __syncthreads_and(int predicate,
                             std::source_location site = std::source_location::current()) {
  return simt::detail::BlockBarrier(simt::detail::BarrierOp::kAnd, predicate, site);
}
inline int __syncthreads_or(int predicate,
                            std::source_location site = std::source_location::current()) {
  return simt::detail::BlockBarrier(simt::detail::BarrierOp::kOr, predicate, site);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  simt::detail::WarpExchange(simt::detail::WarpOp::kSyncWarp, mask, 0, 0, 0, 32);
}
// Blocks of a grid run on different host threads: fences are real fences.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- Warp intrinsics ------------------------------------------------------

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  using simt::detail::WarpOp;
  return simt::detail::FromBits<T>(simt::detail::WarpExchange(
      WarpOp::kShfl, mask, simt::detail::ToBits(var), sizeof(T), src_lane, width));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  using simt::detail::WarpOp;
  return simt::detail::FromBits<T>(simt::detail::WarpExchange(
      WarpOp::kShflUp, mask, simt::detail::ToBits(var), sizeof(T), static_cast<int>(delta), width));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  using simt::detail::WarpOp;
  return simt::detail::FromBits<T>(simt::detail::WarpExchange(WarpOp::kShflDown, mask,
                                                              simt::detail::ToBits(var), sizeof(T),
                                                              static_cast<int>(delta), width));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  using simt::detail::WarpOp;
  return simt::detail::FromBits<T>(simt::detail::WarpExchange(
      WarpOp::kShflXor, mask, simt::detail::ToBits(var), sizeof(T), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      simt::detail::WarpExchange(simt::detail::WarpOp::kBallot, mask, predicate != 0, 4, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      simt::detail::WarpExchange(simt::detail::WarpOp::kAll, mask, predicate != 0, 4, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      simt::detail::WarpExchange(simt::detail::WarpOp::kAny, mask, predicate != 0, 4, 0, 32));
}
template <typename T>
inline unsigned __match_any_sync(unsigned mask, T value) {
  static_assert(std::is_integral_v<T> || std::is_floating_point_v<T>,
                "__match_any_sync takes int, unsigned, long long or floating values");
  return static_cast<unsigned>(simt::detail::WarpExchange(
      simt::detail::WarpOp::kMatchAny, mask, simt::detail::ToBits(value), sizeof(T), 0, 32));
}

// ---- Integer intrinsics ---------------------------------------------------

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

#include "kernels/cuda/simt_math.h"

// ---- Launch ---------------------------------------------------------------

// cuda_runtime.h offers this overload to nvcc only.
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

namespace simt {
namespace detail {

// One kernel launch's type-erased body: calls the kernel with copies of its
// arguments (each thread gets its own copies, as on the GPU).
class KernelBody {
 public:
  virtual ~KernelBody() = default;
  virtual void Run() const = 0;
};
template <typename Fn>
class KernelBodyOf final : public KernelBody {
 public:
  explicit KernelBodyOf(Fn fn) : fn_(std::move(fn)) {}
  void Run() const override { fn_(); }

 private:
  Fn fn_;
};

// A kernel argument of pointer type, checked against the tracked device
// allocations before the launch is queued.
struct PointerArgument {
  int index = 0;
  const void* value = nullptr;
  const char* type = nullptr;  // mangled (typeid(T).name())
};

// Validates and queues a launch on `stream`; takes ownership of `body`.
cudaError_t EnqueueLaunch(const char* name, const void* kernel, dim3 grid, dim3 block,
                          size_t shared_bytes, cudaStream_t stream, bool dependent,
                          KernelBody* body, const PointerArgument* pointers, int n_pointers);

// P is the kernel's parameter type, A the argument given for it.
template <typename P, typename A>
inline void NotePointer(int index, const A& arg, PointerArgument* out, int* n) {
  if constexpr (std::is_pointer_v<P>) {
    const P value = arg;
    out[*n] = PointerArgument{index, static_cast<const void*>(value), typeid(P).name()};
    ++*n;
  }
}

// Queues `kernel`; `dependent`: launched by SIMT_LAUNCH_DEPENDENT, so its
// threads must call SIMT_GRID_WAIT() first.
template <typename... Params, typename... Args>
inline cudaError_t LaunchAs(bool dependent, const char* name, void (*kernel)(Params...), dim3 grid,
                            dim3 block, size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
  PointerArgument pointers[sizeof...(Params) + 1];
  int n_pointers = 0;
  int index = 0;
  (NotePointer<std::decay_t<Params>>(index++, args, pointers, &n_pointers), ...);
  auto fn = [kernel, ... a = static_cast<std::decay_t<Params>>(std::forward<Args>(args))]() {
    kernel(a...);
  };
  auto* body = new KernelBodyOf<decltype(fn)>(std::move(fn));
  return EnqueueLaunch(name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes,
                       stream, dependent, body, pointers, n_pointers);
}

}  // namespace detail

template <typename... Params, typename... Args>
inline cudaError_t Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                          size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  return detail::LaunchAs(false, name, kernel, grid, block, shared_bytes, stream,
                          std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
inline cudaError_t LaunchDependent(const char* name, void (*kernel)(Params...), dim3 grid,
                                   dim3 block, size_t shared_bytes, cudaStream_t stream,
                                   Args&&... args) {
  return detail::LaunchAs(true, name, kernel, grid, block, shared_bytes, stream,
                          std::forward<Args>(args)...);
}

}  // namespace simt

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_DEVICE_H_
