// Part of matmul_x86_kernels.h: the AVX-512 build's 16-lane MatmulRowsOut
// tiles, for many rows (packed pairs of columns) and a few (read in place).
// Included by that file only, in its order (each part uses the ones
// before it); no include guard, internal linkage, as that file says.

namespace switchserve::cpu {
namespace {

#ifdef SWITCHSERVE_MATMUL_ZMM
// ---- 16-lane tiles for many rows (the AVX-512 build) ----
//
// A zmm register holds two 8-lane dot8 accumulators, one per half: the
// columns 2q and 2q + 1 of a pair. Each half's lanes take the same fused
// multiply-adds in the same order as an 8-lane accumulator, and the halves
// are summed as Reduce4x8 sums one, so the bits are the 8-lane tiles'; twice
// the multiply-adds per instruction where the CPU executes 16 lanes at once.

constexpr int kPairRows = 6;  // 24 accumulators, 4 weight vectors, 1 input
constexpr int kPairCols = 4;  // pairs of columns: 8 columns per tile

// (The zero-masking forms with every lane kept, here and in SumPairs: GCC
// 12's plain forms read an undefined register and trip -Wuninitialized.)
inline __m512 Broadcast8(__m256 v) {
  return _mm512_castpd_ps(_mm512_maskz_broadcast_f64x4(0xFF, _mm256_castps_pd(v)));
}

// One row's 8 column sums, in lanes 0-7, from its pair accumulators p0-p3:
// each column's sum is Reduce4x8's tree over its 8 lanes (lanes j and j + 4
// first, then neighbours, then the two halves), computed for all 8 columns
// at once with in-register shuffles instead of per-column extracts.
inline __m512 SumPairs(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
  // Pair q's 128-bit blocks: column 2q lanes 0-3, 4-7; column 2q + 1 lanes
  // 0-3, 4-7. Block b of s03 (s47): column b (b + 4), lanes j + (j + 4).
  const __m512 s03 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, p0, p1, 0x88),
                                   _mm512_maskz_shuffle_f32x4(0xFFFF, p0, p1, 0xDD));
  const __m512 s47 = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, p2, p3, 0x88),
                                   _mm512_maskz_shuffle_f32x4(0xFFFF, p2, p3, 0xDD));
  // Block b: column b's (0 + 1), (2 + 3); column b + 4's (0 + 1), (2 + 3).
  const __m512 t =
      _mm512_add_ps(_mm512_shuffle_ps(s03, s47, 0x88), _mm512_shuffle_ps(s03, s47, 0xDD));
  // Block b: column b, column b + 4 (twice).
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(t, t, 0x88), _mm512_shuffle_ps(t, t, 0xDD));
  return _mm512_maskz_permutexvar_ps(
      0xFFFF, _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), f);
}

// [lo | hi]. (Zero-masking forms with every lane kept, as in Broadcast8.)
inline __m512 Join8(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(
      _mm512_maskz_insertf64x4(0xFF, _mm512_castps_pd(Broadcast8(lo)), _mm256_castps_pd(hi), 1));
}

// Rows j and j + 1's 8 elements from byte `at` of each, widened exactly.
template <DType WT>
inline __m512 LoadPair8(const char* row0, const char* row1, int64_t at) {
  if constexpr (WT == DType::kF32) {
    return Join8(_mm256_loadu_ps(reinterpret_cast<const float*>(row0 + at)),
                 _mm256_loadu_ps(reinterpret_cast<const float*>(row1 + at)));
  } else {
    const __m256i h = _mm256_inserti128_si256(
        _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row0 + at))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row1 + at)), 1);
    if constexpr (WT == DType::kBF16) {
      return _mm512_castsi512_ps(
          _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
    } else {
      return _mm512_maskz_cvtph_ps(0xFFFF, h);
    }
  }
}

// Widens (exactly) weight rows [0, rows) into pairs: pair q, chunk c holds
// the 16 floats [w[2q][8c, 8c + 8) | w[2q + 1][8c, 8c + 8)], zero past k and
// for rows past `rows`; out has kPairCols pairs of `chunks` chunks each. Both
// rows of a pair's full chunk in one widening and one 64-byte store
// (LoadPair8), while the next column group's rows are prefetched.
template <DType WT>
void PackPairs(const WeightMatrix& w, int rows, int k, float* out) {
  const int chunks = (k + 7) / 8;
  const int full = k / 8;
  const int64_t group = GroupBytes<WT>(w.tiling == Tiling::kRowBlocks);
  for (int q = 0; q < kPairCols; ++q) {
    float* o = out + static_cast<int64_t>(q) * chunks * 16;
    const int r0 = 2 * q, r1 = 2 * q + 1;
    if (r0 >= rows) {
      for (int c = 0; c < chunks; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_setzero_ps());
      continue;
    }
    // A pair whose second row is past the last has a zero second half.
    const bool both = r1 < rows;
    const char* row0 = RowStart<WT>(w, r0);
    const char* next0 = RowStart<WT>(w, r0 + rows);
    const char* row1 = both ? RowStart<WT>(w, r1) : nullptr;
    const char* next1 = both ? RowStart<WT>(w, r1 + rows) : nullptr;
    const auto row_chunk = [&](const char* row, int c) {
      return c < full ? Load8<WT>(row + c * group, 0)
                      : LoadPartial8<WT>(row + c * group, 0, k - 8 * c);
    };
    for (int c = 0; c < chunks; ++c) {
      if (((c * group) & 63) == 0) {
        _mm_prefetch(next0 + c * group, _MM_HINT_T1);
        if (both) _mm_prefetch(next1 + c * group, _MM_HINT_T1);
      }
      _mm512_storeu_ps(o + 16 * c, both && c < full
                                       ? LoadPair8<WT>(row0, row1, c * group)
                                       : Join8(row_chunk(row0, c),
                                               both ? row_chunk(row1, c) : _mm256_setzero_ps()));
    }
  }
}

// DotTile over packed pairs: MR rows x the first `nr` (<= 8) columns, over
// chunks [ch_begin, ch_end) of the `chunks` in k. A tile over part of k
// starts from the accumulators `carry` holds (unless ch_begin is 0) and
// leaves its own there (unless ch_end is the last chunk): each lane's chain
// of fused multiply-adds goes on exactly where it stopped.
template <int MR>
void DotTilePairs(const float* const* a, const float* pairs, int k, int ch_begin, int ch_end,
                  float* carry, float* c, int64_t ldc, int nr, float alpha, bool accumulate) {
  const int chunks = (k + 7) / 8;
  const int64_t pair_stride = static_cast<int64_t>(chunks) * 16;
  __m512 acc[MR][kPairCols];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int q = 0; q < kPairCols; ++q) {
      acc[i][q] =
          ch_begin > 0 ? _mm512_loadu_ps(carry + (i * kPairCols + q) * 16) : _mm512_setzero_ps();
    }
  }
  const int full = k / 8;
  for (int ch = ch_begin; ch < ch_end; ++ch) {
    __m512 wv[kPairCols];
#pragma GCC unroll 8
    for (int q = 0; q < kPairCols; ++q) wv[q] = _mm512_loadu_ps(pairs + q * pair_stride + 16 * ch);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 av = Broadcast8(ch < full ? _mm256_loadu_ps(a[i] + 8 * ch)
                                             : LoadPartial8<DType::kF32>(a[i], 8 * ch, k - 8 * ch));
#pragma GCC unroll 8
      for (int q = 0; q < kPairCols; ++q) acc[i][q] = _mm512_fmadd_ps(av, wv[q], acc[i][q]);
    }
  }
  if (ch_end < chunks) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int q = 0; q < kPairCols; ++q) {
        _mm512_storeu_ps(carry + (i * kPairCols + q) * 16, acc[i][q]);
      }
    }
    return;
  }
  // As DotTile: alpha * sum, added to what is there when accumulating.
  const __m512 alpha16 = _mm512_set1_ps(alpha);
  const __mmask16 columns = static_cast<__mmask16>((1u << nr) - 1);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* row = c + i * ldc;
    __m512 sums = _mm512_mul_ps(alpha16, SumPairs(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    if (accumulate) sums = _mm512_add_ps(_mm512_maskz_loadu_ps(columns, row), sums);
    _mm512_mask_storeu_ps(row, columns, sums);
  }
}

using DotTilePairsFn = void (*)(const float* const*, const float*, int, int, int, float*, float*,
                                int64_t, int, float, bool);

template <int... I>
constexpr std::array<DotTilePairsFn, sizeof...(I)> MakeDotTilePairs(
    std::integer_sequence<int, I...>) {
  return {&DotTilePairs<I + 1>...};
}
// kDotTilePairs[mr - 1] = DotTilePairs<mr>.
constexpr std::array<DotTilePairsFn, kPairRows> kDotTilePairs =
    MakeDotTilePairs(std::make_integer_sequence<int, kPairRows>());

// Chunks of 8 k a tile takes before the next rows' tile: a block's packed
// weights (16 KiB) and six rows' inputs (12 KiB) stay in the L1 cache while
// the tiles of all the rows take it in turn, instead of streaming all of k (32
// and 24 KiB at k = 1024) from L2 for every tile. 256 rows took all of k at
// once before, one row block of 64 at a time (packing the weights again for
// each); Intel Xeon (Emerald Rapids) VM, matmul_bench, one thread, three
// alternated rounds, [256 x 1024] x [1024 x 448]: bf16 2951-3106 ->
// 2206-2396 us, f32 2594-3102 -> 2137-2496 us.
constexpr int kPairChunksPerBlock = 64;

// The carried accumulators of the tiles of all the rows.
LineAlignedScratch& CarryBuffer() {
  thread_local LineAlignedScratch buffer;
  return buffer;
}

// MatmulRowsOut for more rows than a register tile: 8 columns of weights at a
// time, packed into pairs once and shared by every row, k a block at a time.
template <DType WT>
void RowsOutManyRows(const MatmulArgs& g) {
  constexpr int kCols = 2 * kPairCols;
  constexpr int kTileCarry = kPairRows * kPairCols * 16;
  const int chunks = (g.k + 7) / 8;
  float* pairs = WidenBuffer().Reserve(static_cast<size_t>(kPairCols) * chunks * 16);
  const int tiles = (g.m + kPairRows - 1) / kPairRows;
  float* carry = CarryBuffer().Reserve(static_cast<size_t>(tiles) * kTileCarry);
  for (int j0 = 0; j0 < g.n; j0 += kCols) {
    const int nr = g.n - j0 < kCols ? g.n - j0 : kCols;
    PackPairs<WT>(g.w.At(j0, 0), nr, g.k, pairs);
    for (int ch0 = 0; ch0 < chunks; ch0 += kPairChunksPerBlock) {
      const int ch1 = chunks - ch0 < kPairChunksPerBlock ? chunks : ch0 + kPairChunksPerBlock;
      for (int i0 = 0; i0 < g.m; i0 += kPairRows) {
        const int mr = g.m - i0 < kPairRows ? g.m - i0 : kPairRows;
        const float* a[kPairRows];
        for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
        kDotTilePairs[mr - 1](a, pairs, g.k, ch0, ch1, carry + i0 / kPairRows * kTileCarry,
                              g.c + i0 * g.ldc + j0, g.ldc, nr, g.alpha, g.accumulate);
      }
    }
  }
}

// ---- 16-lane tiles for a few rows (the AVX-512 build) ----
//
// The pair accumulators above, for products of 2 to 2 * kPairRows - 1 rows,
// whose weights a tile reads once, from memory or the L1 cache, as DotTile
// does: no packing. Each zmm of weights is two rows' groups of 8, [w[2q][p ..
// p + 8) | w[2q + 1][p .. p + 8)], widened in registers; each input group
// of 8 is broadcast to both halves. The same lanes take the same fused
// multiply-adds in the same order as DotTile's, and SumPairs sums them as
// DotTile's reductions do, so the bits are DotTile's; on a CPU that executes
// 16 lanes at once (AMD Zen 5), half the multiply-add instructions.
constexpr int kFewPairRows = 4;  // 16 accumulators, 4 weight vectors, 1 input

// Lanes 0-7.
inline __m256 Low8(__m512 v) {
  return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0x0F, _mm512_castps_pd(v), 0));
}

// DotTile<WT, MR, 8, kPrefetch, kTiled> in pair accumulators: MR rows x 8
// columns of w, every element with DotTile's operations.
template <DType WT, int MR, bool kPrefetch, bool kTiled>
void DotTileFewPairs(const float* const* a, const WeightMatrix& w, int k, float* c, int64_t ldc,
                     float alpha, bool accumulate) {
  constexpr int64_t kGroup = GroupBytes<WT>(kTiled);
  const char* row[2 * kPairCols];
#pragma GCC unroll 8
  for (int j = 0; j < 2 * kPairCols; ++j) row[j] = RowStart<WT>(w, j);
  __m512 acc[MR][kPairCols];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int q = 0; q < kPairCols; ++q) acc[i][q] = _mm512_setzero_ps();
  }
  const int k8 = k & ~7;
  for (int p = 0; p < k8; p += 8) {
    const int64_t at = p / 8 * kGroup;
    if (kPrefetch && !kTiled && ((p * ElementBytes<WT>()) & 63) == 0) {
      // As DotTile: the next tile's rows, a line each per line consumed here.
      const int64_t next_rows = 2 * kPairCols * w.ld * ElementBytes<WT>();
#pragma GCC unroll 8
      for (int j = 0; j < 2 * kPairCols; ++j) _mm_prefetch(row[j] + next_rows + at, _MM_HINT_T1);
    }
    __m512 wv[kPairCols];
#pragma GCC unroll 8
    for (int q = 0; q < kPairCols; ++q) wv[q] = LoadPair8<WT>(row[2 * q], row[2 * q + 1], at);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 av = Broadcast8(_mm256_loadu_ps(a[i] + p));
#pragma GCC unroll 8
      for (int q = 0; q < kPairCols; ++q) acc[i][q] = _mm512_fmadd_ps(av, wv[q], acc[i][q]);
    }
  }
  if (k8 < k) {
    const int rest = k - k8;
    const int64_t at = k8 / 8 * kGroup;
    __m512 wv[kPairCols];
#pragma GCC unroll 8
    for (int q = 0; q < kPairCols; ++q) {
      wv[q] = Join8(LoadPartial8<WT>(row[2 * q] + at, 0, rest),
                    LoadPartial8<WT>(row[2 * q + 1] + at, 0, rest));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 av = Broadcast8(LoadPartial8<DType::kF32>(a[i], k8, rest));
#pragma GCC unroll 8
      for (int q = 0; q < kPairCols; ++q) acc[i][q] = _mm512_fmadd_ps(av, wv[q], acc[i][q]);
    }
  }
  // As DotTilePairs: alpha * sum, added to what is there when accumulating.
  const __m256 alpha8 = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* out = c + i * ldc;
    __m256 sums = _mm256_mul_ps(alpha8, Low8(SumPairs(acc[i][0], acc[i][1], acc[i][2], acc[i][3])));
    if (accumulate) sums = _mm256_add_ps(_mm256_loadu_ps(out), sums);
    _mm256_storeu_ps(out, sums);
  }
}

// kTable[tiled][mr - 1] = DotTileFewPairs<WT, mr, kPrefetch, tiled>.
template <DType WT, bool kPrefetch>
struct FewPairTiles {
  template <bool kTiled, int... I>
  static constexpr auto Make(std::integer_sequence<int, I...>) {
    return std::array<DotTileFn, kFewPairRows>{&DotTileFewPairs<WT, I + 1, kPrefetch, kTiled>...};
  }
  static constexpr std::array<DotTileFn, kFewPairRows> kTable[2] = {
      Make<false>(std::make_integer_sequence<int, kFewPairRows>()),
      Make<true>(std::make_integer_sequence<int, kFewPairRows>())};
  static DotTileFn For(const WeightMatrix& w, int mr) {
    return kTable[w.tiling == Tiling::kRowBlocks][mr - 1];
  }
};

#endif  // SWITCHSERVE_MATMUL_ZMM

}  // namespace
}  // namespace switchserve::cpu
