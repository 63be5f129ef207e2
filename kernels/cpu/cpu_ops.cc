#include "kernels/cpu/cpu_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/vector_math.h"

namespace switchserve::cpu {

void WidenValues(const Tensor& t, int64_t offset, int count, float* out) {
  switch (t.dtype()) {
    case DType::kBF16: {
      const uint16_t* half = t.half() + offset;
#pragma omp simd
      for (int i = 0; i < count; ++i) out[i] = BFloat16ToFloat(half[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* half = t.half() + offset;
#pragma omp simd
      for (int i = 0; i < count; ++i) out[i] = HalfToFloat(half[i]);
      return;
    }
    default:
      std::memcpy(out, t.f32() + offset, count * sizeof(float));
      return;
  }
}

namespace {

// A row's sum of x[i] or of (x[i] - center)^2 (`squares`), in double:
// element i goes to partial sum i mod 4, and the partials add as (s0 + s1) +
// (s2 + s3). Four independent chains a row instead of one, so a row is not
// bound by the add's latency; a fixed order, so a row's sum depends on its
// values alone. AddToPartials adds elements [from, d).
template <bool kSquares>
inline void AddToPartials(const float* x, int from, int d, double center, double* part) {
  for (int i = from; i < d; ++i) {
    double c = x[i];
    if constexpr (kSquares) {
      c -= center;
      c *= c;
    }
    part[i % 4] += c;
  }
}

inline double SumOfPartials(const double* part) {
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// Those sums for R rows at once where the CPU has AVX2 (their chains
// overlap): the partials of a row in one register, four floats widened by
// one instruction (GCC builds a generic four-float widening as two halves
// and an insert, which took most of a norm's time: BM_NormRows).
template <int R, bool kSquares>
__attribute__((target("avx2"))) void RowSumsAvx2(const float* const* x, int d, const double* center,
                                                 double* sums) {
  __m256d s[R];
  for (int r = 0; r < R; ++r) s[r] = _mm256_setzero_pd();
  int i = 0;
  for (; i + 4 <= d; i += 4) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m256d c = _mm256_cvtps_pd(_mm_loadu_ps(x[r] + i));
      if constexpr (kSquares) {
        c = _mm256_sub_pd(c, _mm256_set1_pd(center[r]));
        c = _mm256_mul_pd(c, c);
      }
      s[r] = _mm256_add_pd(s[r], c);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) double part[4];
    _mm256_store_pd(part, s[r]);
    AddToPartials<kSquares>(x[r], i, d, kSquares ? center[r] : 0.0, part);
    sums[r] = SumOfPartials(part);
  }
}

template <int R, bool kSquares>
void RowSums(const float* const* x, int d, const double* center, double* sums) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    RowSumsAvx2<R, kSquares>(x, d, center, sums);
    return;
  }
  for (int r = 0; r < R; ++r) {
    double part[4] = {};
    AddToPartials<kSquares>(x[r], 0, d, kSquares ? center[r] : 0.0, part);
    sums[r] = SumOfPartials(part);
  }
}

// NormRows over R rows at once (inlined into each build of NormRows). Each
// element (x - mean) * inv * weight, then + bias, in one pass.
template <int R>
[[gnu::always_inline]] inline void NormRowGroup(NormKind kind, float eps, const float* x, int d,
                                                const float* weight, const float* bias,
                                                float* out) {
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + static_cast<int64_t>(r) * d;
  double mean[R] = {};
  if (kind == NormKind::kLayerNorm) {
    RowSums<R, false>(xr, d, nullptr, mean);
    for (int r = 0; r < R; ++r) mean[r] /= d;
  }
  double var[R];
  RowSums<R, true>(xr, d, mean, var);
  for (int r = 0; r < R; ++r) {
    const float inv = static_cast<float>(1.0 / std::sqrt(var[r] / d + eps));
    const float m = static_cast<float>(mean[r]);
    const float* xi = xr[r];
    float* o = out + static_cast<int64_t>(r) * d;
    if (bias != nullptr) {
      for (int i = 0; i < d; ++i) o[i] = (xi[i] - m) * inv * weight[i] + bias[i];
    } else {
      for (int i = 0; i < d; ++i) o[i] = (xi[i] - m) * inv * weight[i];
    }
  }
}

}  // namespace

// Built for AVX-512 and AVX2 too, picked at load time where the CPU has them:
// the same IEEE operations per element either way (no fused multiply-add), so
// the same bits.
SWITCHSERVE_TARGET_CLONES("avx512f", "avx2", "default")
void NormRows(NormKind kind, float eps, const float* x, int rows, int d, const float* weight,
              const float* bias, float* out) {
  constexpr int kRows = 4;
  int r = 0;
  for (; r + kRows <= rows; r += kRows) {
    NormRowGroup<kRows>(kind, eps, x + static_cast<int64_t>(r) * d, d, weight, bias,
                        out + static_cast<int64_t>(r) * d);
  }
  for (; r < rows; ++r) {
    NormRowGroup<1>(kind, eps, x + static_cast<int64_t>(r) * d, d, weight, bias,
                    out + static_cast<int64_t>(r) * d);
  }
}

void NormRows(NormKind kind, float eps, const float* x, int rows, int d, const float* weight,
              const float* bias, float* out, WorkerPool* pool, int64_t parallel_min_values) {
  ForRowRanges(pool, rows, static_cast<int64_t>(rows) * d, parallel_min_values,
               [&](int begin, int end) {
                 NormRows(kind, eps, x + static_cast<int64_t>(begin) * d, end - begin, d, weight,
                          bias, out + static_cast<int64_t>(begin) * d);
               });
}

void AddBiasRows(float* x, int rows, int n, int ld, const float* bias) {
  if (bias == nullptr) return;
  for (int r = 0; r < rows; ++r) {
    float* xr = x + static_cast<int64_t>(r) * ld;
#pragma omp simd
    for (int i = 0; i < n; ++i) xr[i] += bias[i];
  }
}

float Sigmoid(float z) { return 1.0f / (1.0f + Exp(-z)); }

// Built for AVX-512 and AVX2 too, picked at load time where the CPU has them:
// four and two times the lanes for GELU's and SiLU's polynomials. The same
// IEEE operations per element at any width (no fused multiply-add:
// -ffp-contract=off), so the same bits.
SWITCHSERVE_TARGET_CLONES("avx512f", "avx2", "default")
void ApplyActivation(Activation act, float* x, int64_t n) {
  switch (act) {
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] : 0.0f;
      return;
    case Activation::kGelu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = Gelu(x[i]);
      return;
    case Activation::kSilu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = Silu(x[i]);
      return;
  }
}

void RopeTable::Reserve(int positions) {
  if (positions <= positions_) return;
  const int half = n_rot_ / 2;
  cos_.resize(static_cast<size_t>(positions) * half);
  sin_.resize(static_cast<size_t>(positions) * half);
  for (int p = positions_; p < positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(base_, -2.0 * i / n_rot_);
      const double angle = p * inv_freq;
      cos_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  positions_ = positions;
}

// Built for AVX2 too (as ApplyActivation): the same multiplies and adds per
// element at any width, so the same bits.
SWITCHSERVE_TARGET_CLONES("avx2", "default")
void RopeTable::Apply(float* x, int heads, int head_dim, int position) const {
  const int half = n_rot_ / 2;
  if (half == 0) return;
  const float* c = cos_.data() + static_cast<size_t>(position) * half;
  const float* s = sin_.data() + static_cast<size_t>(position) * half;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

// Built for AVX-512 and AVX2 too, picked at load time where the CPU has
// them: the same multiply and add per element at any width (no fused
// multiply-add), so the same bits.
SWITCHSERVE_TARGET_CLONES("avx512f", "avx2", "default")
void AddScaledRow(float* row, const float* product, float weight, int n) {
#pragma omp simd
  for (int c = 0; c < n; ++c) row[c] += weight * product[c];
}

void AddExpertOutputRows(const std::vector<ExpertOutputs>& groups, int width, int t_begin,
                         int t_end, bool from_zero) {
  // Every slot is walked, those of the range's tokens added: a row's
  // additions come in the same order whatever the range.
  if (from_zero) {
    for (const ExpertOutputs& group : groups) {
      for (int t = t_begin; t < t_end; ++t) {
        std::fill_n(group.dst + t * group.dst_stride, width, 0.0f);
      }
    }
  }
  for (const ExpertOutputs& group : groups) {
    const ExpertAssignments& as = *group.assignments;
    for (int e = 0; e < as.n_experts; ++e) {
      for (int s = as.begin(e); s < as.end(e); ++s) {
        const int t = as.token[s];
        if (t < t_begin || t >= t_end) continue;
        const float wt = as.weight[s];
        const float* product = group.product + static_cast<int64_t>(s) * width;
        AddScaledRow(group.dst + t * group.dst_stride, product, wt, width);
      }
    }
  }
}

void AddExpertOutputs(const std::vector<ExpertOutputs>& groups, int width, int tokens,
                      WorkerPool* pool, int64_t parallel_min_values) {
  int64_t slots = 0;
  for (const ExpertOutputs& group : groups) slots += group.assignments->offsets.back();
  ForRowRanges(pool, tokens, slots * width, parallel_min_values, [&](int t_begin, int t_end) {
    AddExpertOutputRows(groups, width, t_begin, t_end, /*from_zero=*/false);
  });
}

}  // namespace switchserve::cpu
