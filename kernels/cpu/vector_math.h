// exp, GELU and SiLU for f32, written so that a loop over an array
// vectorizes (no calls, no branches, no tables): the CPU backend's
// activations and attention softmax ran glibc's scalar expf / erff, one call
// per element. Each is a fixed sequence of IEEE operations (the backend is
// built with -ffp-contract=off), so an element's result depends on its value
// alone, whether a vector or the scalar remainder of a loop computes it.
//
// Accuracy: Exp within 2 ulp of exp over its normal range; Gelu within
// about 4e-7 relative of the exact (erf) GELU, plus up to 2e-7 x^2 in the
// negative tail (the exponent -x^2 / 2 rounded to f32), where the f32 form
// 0.5 x (1 + erf(x / sqrt 2)) cancels (3e-4 relative at -4, 0 from -6 on).
#ifndef SWITCHSERVE_KERNELS_CPU_VECTOR_MATH_H_
#define SWITCHSERVE_KERNELS_CPU_VECTOR_MATH_H_

#include <bit>
#include <cstdint>
#include <limits>

namespace switchserve::cpu {

// exp(x). From -86.99 down (where 2^n would leave the normal range) it
// returns 0, from 88.72 up +inf, and NaN for NaN; in between a normal float.
inline float Exp(float x) {
  constexpr float kLow = -86.99f, kHigh = 88.72f;
  const float xc = x > kLow ? (x < kHigh ? x : kHigh) : kLow;  // NaN -> kLow
  // x = n ln2 + r, |r| <= ln2 / 2: n rounded to nearest by the 1.5 * 2^23
  // shift, ln2 in two parts so that n * hi is exact.
  const float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  // e^r by its Taylor series to r^7 (truncation below 4e-9 relative).
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // p * 2^n, n in [-125, 128] (p < 1 when n is 128): add n to the exponent
  // field.
  const float y = std::bit_cast<float>(std::bit_cast<int32_t>(p) + (static_cast<int32_t>(n) << 23));
  const float inf = std::numeric_limits<float>::infinity();
  const float bounded = x > kLow ? (x < kHigh ? y : inf) : 0.0f;
  return x != x ? x : bounded;
}

// erfc(z) for z >= 0 (Chebyshev fit of Numerical Recipes, section 6.2:
// fractional error below 1.2e-7 everywhere).
inline float ErfcNonNegative(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * Exp(p - z * z);
}

// x * Phi(x) = 0.5 x erfc(-x / sqrt 2): for x < 0 erfc's small tail itself,
// for x >= 0 2 - erfc(x / sqrt 2), so no digits cancel on either side.
inline float Gelu(float x) {
  const float z = (x < 0.0f ? -x : x) * 0.70710678118654752f;
  const float e = ErfcNonNegative(z);
  return 0.5f * x * (x < 0.0f ? e : 2.0f - e);
}

inline float Silu(float x) { return x / (1.0f + Exp(-x)); }

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_VECTOR_MATH_H_
