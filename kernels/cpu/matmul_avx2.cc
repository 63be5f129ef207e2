// The kernels of matmul.h for AVX2 + FMA + F16C. Half-precision weights are
// widened in registers (bf16: a 16-bit shift; f16: vcvtph2ps), or, when many
// rows reuse them, a tile at a time into a thread-local f32 buffer: widening
// is exact, so both give the same bits.
//
// Everything here is compiled for AVX2 by the target pragma below, which
// applies to the functions defined after it only: the standard library
// included above it keeps the baseline instruction set, so no out-of-line
// copy of an inline library function can carry AVX2 instructions into code
// that runs on any CPU.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace switchserve::cpu {
namespace {

// Rows x columns of one register tile of MatmulRowsOut (MR x NR
// accumulators), and of MatmulRowsIn (MR x NV vectors of 8 columns).
constexpr int kOutRows = 4;
constexpr int kOutCols = 3;
constexpr int kInRows = 4;
constexpr int kInVectors = 3;
// A single row of MatmulRowsIn (decode) keeps more vectors in flight.
constexpr int kInVectorsOneRow = 8;
// Rows of `a` processed against one tile of weights before moving on, so that
// they stay in the L2 cache.
constexpr int kRowBlock = 64;

template <DType WT>
inline __m256 Load8(const void* base, int64_t index) {
  if constexpr (WT == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
    if constexpr (WT == DType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

template <DType WT>
constexpr int ElementBytes() {
  return WT == DType::kF32 ? 4 : 2;
}

// The first `count` (< 8) elements from `index` on, the other lanes zero.
template <DType WT>
inline __m256 LoadPartial8(const void* base, int64_t index, int count) {
  alignas(32) unsigned char buffer[32] = {};
  std::memcpy(buffer, static_cast<const char*>(base) + index * ElementBytes<WT>(),
              count * ElementBytes<WT>());
  return Load8<WT>(buffer, 0);
}

// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))
inline float Reduce8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

inline float FmaScalar(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// ---- MatmulRowsOut ----

// out[i][j] = dot8(a row i, w row j) for an MR x NR tile.
template <DType WT, int MR, int NR>
void DotTile(const float* const* a, const void* w, int64_t ldw, int k, float* out) {
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int k8 = k & ~7;
  for (int p = 0; p < k8; p += 8) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = Load8<WT>(w, j * ldw + p);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_loadu_ps(a[i] + p);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, wv[j], acc[i][j]);
    }
  }
  if (k8 < k) {
    const int rest = k - k8;
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = LoadPartial8<WT>(w, j * ldw + k8, rest);
    for (int i = 0; i < MR; ++i) {
      const __m256 av = LoadPartial8<DType::kF32>(a[i], k8, rest);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) out[i * NR + j] = Reduce8(acc[i][j]);
  }
}

using DotTileFn = void (*)(const float* const*, const void*, int64_t, int, float*);

template <DType WT, int MR, int NR>
constexpr DotTileFn DotTileAt() {
  return &DotTile<WT, MR, NR>;
}

// The tile function for mr x nr (1 <= mr <= kOutRows, 1 <= nr <= kOutCols).
template <DType WT>
DotTileFn DotTileFor(int mr, int nr) {
  static constexpr DotTileFn kTable[kOutRows][kOutCols] = {
      {DotTileAt<WT, 1, 1>(), DotTileAt<WT, 1, 2>(), DotTileAt<WT, 1, 3>()},
      {DotTileAt<WT, 2, 1>(), DotTileAt<WT, 2, 2>(), DotTileAt<WT, 2, 3>()},
      {DotTileAt<WT, 3, 1>(), DotTileAt<WT, 3, 2>(), DotTileAt<WT, 3, 3>()},
      {DotTileAt<WT, 4, 1>(), DotTileAt<WT, 4, 2>(), DotTileAt<WT, 4, 3>()},
  };
  return kTable[mr - 1][nr - 1];
}

// Thread-local f32 copy of a tile of half-precision weights.
std::vector<float>& WidenBuffer() {
  thread_local std::vector<float> buffer;
  return buffer;
}

template <DType WT>
void WidenRows(const void* w, int64_t ldw, int rows, int k, float* out) {
  for (int r = 0; r < rows; ++r) {
    int p = 0;
    for (; p + 8 <= k; p += 8) _mm256_storeu_ps(out + r * k + p, Load8<WT>(w, r * ldw + p));
    if (p < k) {
      alignas(32) float rest[8];
      _mm256_store_ps(rest, LoadPartial8<WT>(w, r * ldw + p, k - p));
      std::memcpy(out + r * k + p, rest, (k - p) * sizeof(float));
    }
  }
}

template <DType WT>
void RowsOut(const MatmulArgs& g) {
  const int64_t ldw = g.w.ld;
  // Many rows reuse each weight tile: widen it once (exact) rather than in
  // every register tile.
  const bool widen = WT != DType::kF32 && g.m > kOutRows;
  std::vector<float>& wide = WidenBuffer();
  if (widen && wide.size() < static_cast<size_t>(kOutCols) * g.k) wide.resize(kOutCols * g.k);
  float out[kOutRows * kOutCols];
  for (int i_block = 0; i_block < g.m; i_block += kRowBlock) {
    const int i_end = g.m < i_block + kRowBlock ? g.m : i_block + kRowBlock;
    for (int j0 = 0; j0 < g.n; j0 += kOutCols) {
      const int nr = g.n - j0 < kOutCols ? g.n - j0 : kOutCols;
      const void* w = static_cast<const char*>(g.w.data) + j0 * ldw * ElementBytes<WT>();
      DotTileFn tile_fn_wide = nullptr;
      if (widen) {
        WidenRows<WT>(w, ldw, nr, g.k, wide.data());
        tile_fn_wide = nr == kOutCols ? DotTileAt<DType::kF32, kOutRows, kOutCols>() : nullptr;
      }
      for (int i0 = i_block; i0 < i_end; i0 += kOutRows) {
        const int mr = i_end - i0 < kOutRows ? i_end - i0 : kOutRows;
        const float* a[kOutRows];
        for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
        if (widen) {
          DotTileFn fn = (tile_fn_wide != nullptr && mr == kOutRows)
                             ? tile_fn_wide
                             : DotTileFor<DType::kF32>(mr, nr);
          fn(a, wide.data(), g.k, g.k, out);
        } else {
          DotTileFor<WT>(mr, nr)(a, w, ldw, g.k, out);
        }
        for (int i = 0; i < mr; ++i) {
          float* c = g.c + (i0 + i) * g.ldc + j0;
          for (int j = 0; j < nr; ++j) {
            const float r = g.alpha * out[i * nr + j];
            c[j] = g.accumulate ? c[j] + r : r;
          }
        }
      }
    }
  }
}

// ---- MatmulRowsIn ----

// c[i][0 .. 8 NV) = fma chain over p of a[i][p] * w[p][...], MR rows.
template <DType WT, int MR, int NV>
void ChainTile(const float* const* a, const void* w, int64_t ldw, int k, float* c, int64_t ldc,
               bool accumulate) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = accumulate ? _mm256_loadu_ps(c + i * ldc + 8 * v) : _mm256_setzero_ps();
    }
  }
  for (int p = 0; p < k; ++p) {
    __m256 wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = Load8<WT>(w, p * ldw + 8 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 ab = _mm256_broadcast_ss(a[i] + p);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(ab, wv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]);
  }
}

using ChainTileFn = void (*)(const float* const*, const void*, int64_t, int, float*, int64_t, bool);

template <DType WT, int MR, int NV>
constexpr ChainTileFn ChainTileAt() {
  return &ChainTile<WT, MR, NV>;
}

template <DType WT>
ChainTileFn ChainTileFor(int mr, int nv) {
  static constexpr ChainTileFn kTable[kInRows][kInVectors] = {
      {ChainTileAt<WT, 1, 1>(), ChainTileAt<WT, 1, 2>(), ChainTileAt<WT, 1, 3>()},
      {ChainTileAt<WT, 2, 1>(), ChainTileAt<WT, 2, 2>(), ChainTileAt<WT, 2, 3>()},
      {ChainTileAt<WT, 3, 1>(), ChainTileAt<WT, 3, 2>(), ChainTileAt<WT, 3, 3>()},
      {ChainTileAt<WT, 4, 1>(), ChainTileAt<WT, 4, 2>(), ChainTileAt<WT, 4, 3>()},
  };
  return kTable[mr - 1][nv - 1];
}

template <DType WT>
ChainTileFn OneRowChainTileFor(int nv) {
  static constexpr ChainTileFn kTable[kInVectorsOneRow] = {
      ChainTileAt<WT, 1, 1>(), ChainTileAt<WT, 1, 2>(), ChainTileAt<WT, 1, 3>(),
      ChainTileAt<WT, 1, 4>(), ChainTileAt<WT, 1, 5>(), ChainTileAt<WT, 1, 6>(),
      ChainTileAt<WT, 1, 7>(), ChainTileAt<WT, 1, 8>(),
  };
  return kTable[nv - 1];
}

// The columns past the last full vector, one scalar chain each: the same
// fused multiply-adds as a vector lane.
template <DType WT>
void ChainColumnsScalar(const MatmulArgs& g, int j_begin) {
  for (int i = 0; i < g.m; ++i) {
    const float* a = RowOfA(g, i);
    float* c = g.c + i * g.ldc;
    for (int j = j_begin; j < g.n; ++j) {
      float acc = g.accumulate ? c[j] : 0.0f;
      for (int p = 0; p < g.k; ++p) {
        float wv;
        if constexpr (WT == DType::kF32) {
          wv = static_cast<const float*>(g.w.data)[p * g.w.ld + j];
        } else {
          wv = _mm256_cvtss_f32(LoadPartial8<WT>(g.w.data, p * g.w.ld + j, 1));
        }
        acc = FmaScalar(a[p], wv, acc);
      }
      c[j] = acc;
    }
  }
}

// Widens (exactly) columns [j0, j0 + 8 nv) of w's k rows into out[k][8 nv].
template <DType WT>
void WidenPanel(const void* w, int64_t ldw, int k, int j0, int nv, float* out) {
  for (int p = 0; p < k; ++p) {
    for (int v = 0; v < nv; ++v) {
      _mm256_storeu_ps(out + (p * nv + v) * 8, Load8<WT>(w, p * ldw + j0 + 8 * v));
    }
  }
}

template <DType WT>
void RowsIn(const MatmulArgs& g) {
  const int n8 = g.n & ~7;
  const int vectors = n8 / 8;
  if (g.m == 1) {
    const float* a[1] = {RowOfA(g, 0)};
    for (int v0 = 0; v0 < vectors; v0 += kInVectorsOneRow) {
      const int nv = vectors - v0 < kInVectorsOneRow ? vectors - v0 : kInVectorsOneRow;
      OneRowChainTileFor<WT>(nv)(a, g.w.At(0, 8 * v0).data, g.w.ld, g.k, g.c + 8 * v0, g.ldc,
                                 g.accumulate);
    }
  } else {
    const bool widen = WT != DType::kF32 && g.m > kInRows;
    std::vector<float>& wide = WidenBuffer();
    if (widen && wide.size() < static_cast<size_t>(8 * kInVectors) * g.k) {
      wide.resize(8 * kInVectors * g.k);
    }
    for (int i_block = 0; i_block < g.m; i_block += kRowBlock) {
      const int i_end = g.m < i_block + kRowBlock ? g.m : i_block + kRowBlock;
      for (int v0 = 0; v0 < vectors; v0 += kInVectors) {
        const int nv = vectors - v0 < kInVectors ? vectors - v0 : kInVectors;
        const void* w = g.w.At(0, 8 * v0).data;
        int64_t ldw = g.w.ld;
        if (widen) {
          WidenPanel<WT>(g.w.data, g.w.ld, g.k, 8 * v0, nv, wide.data());
          w = wide.data();
          ldw = 8 * nv;
        }
        for (int i0 = i_block; i0 < i_end; i0 += kInRows) {
          const int mr = i_end - i0 < kInRows ? i_end - i0 : kInRows;
          const float* a[kInRows];
          for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
          const ChainTileFn fn =
              widen ? ChainTileFor<DType::kF32>(mr, nv) : ChainTileFor<WT>(mr, nv);
          fn(a, w, ldw, g.k, g.c + i0 * g.ldc + 8 * v0, g.ldc, g.accumulate);
        }
      }
    }
  }
  if (n8 < g.n) ChainColumnsScalar<WT>(g, n8);
}

template <void (*F32)(const MatmulArgs&), void (*BF16)(const MatmulArgs&),
          void (*F16)(const MatmulArgs&)>
void ByDtype(const MatmulArgs& g) {
  if (g.m <= 0 || g.n <= 0) return;
  switch (g.w.dtype) {
    case DType::kBF16:
      return BF16(g);
    case DType::kF16:
      return F16(g);
    default:
      return F32(g);
  }
}

}  // namespace

const MatmulKernels& Avx2Kernels() {
  static constexpr MatmulKernels kKernels = {
      &ByDtype<RowsOut<DType::kF32>, RowsOut<DType::kBF16>, RowsOut<DType::kF16>>,
      &ByDtype<RowsIn<DType::kF32>, RowsIn<DType::kBF16>, RowsIn<DType::kF16>>,
  };
  return kKernels;
}

}  // namespace switchserve::cpu

#pragma GCC pop_options
