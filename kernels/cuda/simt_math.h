// CUDA device math and atomics for g++ (part of simt_device.h; not included on
// its own). The fast-math intrinsics (__expf, __fdividef, ...) are the exact
// functions here: their GPU approximations differ by a few ulp, which is why
// kernel tests compare with tolerances against CPU references but bitwise
// across thread orders (the executor is deterministic).
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_MATH_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_MATH_H_

#include <atomic>
#include <cmath>
#include <cstring>

// ---- Float math not in <cmath> --------------------------------------------

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }  // glibc's sincosf

inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, sizeof(i));
  return i;
}
inline unsigned __float_as_uint(float x) {
  unsigned i;
  std::memcpy(&i, &x, sizeof(i));
  return i;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, sizeof(x));
  return x;
}
inline float __uint_as_float(unsigned i) {
  float x;
  std::memcpy(&x, &i, sizeof(x));
  return x;
}
inline long long __double_as_longlong(double x) {
  long long i;
  std::memcpy(&i, &x, sizeof(i));
  return i;
}
inline double __longlong_as_double(long long i) {
  double x;
  std::memcpy(&x, &i, sizeof(x));
  return x;
}
inline int __float2int_rn(float x) { return static_cast<int>(nearbyintf(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }

// CUDA's global min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- Atomics --------------------------------------------------------------
// On global and shared memory alike. Blocks run on several host threads, so
// these are real atomic read-modify-writes (relaxed, as CUDA's are).

namespace simt::detail {
template <typename T>
inline std::atomic_ref<T> Atomic(T* address) {
  return std::atomic_ref<T>(*address);
}
template <typename T>
inline T AtomicMax(T* address, T value) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (old < value && !ref.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
inline T AtomicMin(T* address, T value) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (value < old && !ref.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
inline T AtomicCas(T* address, T compare, T value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;  // the old value, whether or not it was replaced
}
}  // namespace simt::detail

inline int atomicAdd(int* a, int v) {
  return simt::detail::Atomic(a).fetch_add(v, std::memory_order_relaxed);
}
inline unsigned atomicAdd(unsigned* a, unsigned v) {
  return simt::detail::Atomic(a).fetch_add(v, std::memory_order_relaxed);
}
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return simt::detail::Atomic(a).fetch_add(v, std::memory_order_relaxed);
}
inline float atomicAdd(float* a, float v) {
  return simt::detail::Atomic(a).fetch_add(v, std::memory_order_relaxed);
}
inline double atomicAdd(double* a, double v) {
  return simt::detail::Atomic(a).fetch_add(v, std::memory_order_relaxed);
}
inline int atomicSub(int* a, int v) {
  return simt::detail::Atomic(a).fetch_sub(v, std::memory_order_relaxed);
}
inline unsigned atomicSub(unsigned* a, unsigned v) {
  return simt::detail::Atomic(a).fetch_sub(v, std::memory_order_relaxed);
}
inline int atomicExch(int* a, int v) {
  return simt::detail::Atomic(a).exchange(v, std::memory_order_relaxed);
}
inline unsigned atomicExch(unsigned* a, unsigned v) {
  return simt::detail::Atomic(a).exchange(v, std::memory_order_relaxed);
}
inline unsigned long long atomicExch(unsigned long long* a, unsigned long long v) {
  return simt::detail::Atomic(a).exchange(v, std::memory_order_relaxed);
}
inline float atomicExch(float* a, float v) {
  return simt::detail::Atomic(a).exchange(v, std::memory_order_relaxed);
}
inline int atomicMax(int* a, int v) { return simt::detail::AtomicMax(a, v); }
inline unsigned atomicMax(unsigned* a, unsigned v) { return simt::detail::AtomicMax(a, v); }
inline long long atomicMax(long long* a, long long v) { return simt::detail::AtomicMax(a, v); }
inline unsigned long long atomicMax(unsigned long long* a, unsigned long long v) {
  return simt::detail::AtomicMax(a, v);
}
inline int atomicMin(int* a, int v) { return simt::detail::AtomicMin(a, v); }
inline unsigned atomicMin(unsigned* a, unsigned v) { return simt::detail::AtomicMin(a, v); }
inline long long atomicMin(long long* a, long long v) { return simt::detail::AtomicMin(a, v); }
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  return simt::detail::AtomicMin(a, v);
}
inline int atomicCAS(int* a, int compare, int v) { return simt::detail::AtomicCas(a, compare, v); }
inline unsigned atomicCAS(unsigned* a, unsigned compare, unsigned v) {
  return simt::detail::AtomicCas(a, compare, v);
}
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long compare,
                                    unsigned long long v) {
  return simt::detail::AtomicCas(a, compare, v);
}
inline int atomicAnd(int* a, int v) {
  return simt::detail::Atomic(a).fetch_and(v, std::memory_order_relaxed);
}
inline unsigned atomicAnd(unsigned* a, unsigned v) {
  return simt::detail::Atomic(a).fetch_and(v, std::memory_order_relaxed);
}
inline int atomicOr(int* a, int v) {
  return simt::detail::Atomic(a).fetch_or(v, std::memory_order_relaxed);
}
inline unsigned atomicOr(unsigned* a, unsigned v) {
  return simt::detail::Atomic(a).fetch_or(v, std::memory_order_relaxed);
}

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_MATH_H_
