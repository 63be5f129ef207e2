// Part of matmul_x86_kernels.h: MatmulRowsIn: chains of columns, packed panels,
// a few rows in place, and the AVX-512 build's 16-lane panels.
// Included by that file only, in its order (each part uses the ones
// before it); no include guard, internal linkage, as that file says.

namespace switchserve::cpu {
namespace {

// ---- MatmulRowsIn ----

// bf16 columns two vectors at a time: one 16-element load widens to the even
// columns (a shift) and the odd ones (a mask), with no shuffle-port work; the
// accumulators then hold [even | odd] columns, and each column's chain is
// the same fused multiply-adds in the same order as a plain vector lane.
inline void SplitEvenOdd(__m256 v0, __m256 v1, __m256* even, __m256* odd) {
  // shuffle_ps works within 128-bit halves; permute4x64 puts the 64-bit
  // pieces back in column order.
  *even = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
  *odd = _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
}

inline void MergeEvenOdd(__m256 even, __m256 odd, float* out) {
  const __m256 lo = _mm256_unpacklo_ps(even, odd);  // columns 0-3 | 8-11
  const __m256 hi = _mm256_unpackhi_ps(even, odd);  // columns 4-7 | 12-15
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}

template <int MR, int NV, bool kPrefetch>
void ChainTileBf16Pairs(const float* const* a, const uint16_t* w, int64_t ldw, int k, float* c,
                        int64_t ldc, bool accumulate) {
  static_assert(NV % 2 == 0);
  constexpr int kPairs = NV / 2;
  __m256 even[MR][kPairs], odd[MR][kPairs];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int q = 0; q < kPairs; ++q) {
      if (accumulate) {
        SplitEvenOdd(_mm256_loadu_ps(c + i * ldc + 16 * q),
                     _mm256_loadu_ps(c + i * ldc + 16 * q + 8), &even[i][q], &odd[i][q]);
      } else {
        even[i][q] = odd[i][q] = _mm256_setzero_ps();
      }
    }
  }
  const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t ahead = kPrefetch ? RowsInAheadBytes(2 * ldw) : 0;
  for (int p = 0; p < k; ++p) {
    if constexpr (kPrefetch) {
      PrefetchBytes<32 * kPairs>(reinterpret_cast<const char*>(w + p * ldw) + ahead);
    }
    __m256 we[kPairs], wo[kPairs];
#pragma GCC unroll 8
    for (int q = 0; q < kPairs; ++q) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * ldw + 16 * q));
      we[q] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
      wo[q] = _mm256_castsi256_ps(_mm256_and_si256(h, high_half));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 ab = _mm256_broadcast_ss(a[i] + p);
#pragma GCC unroll 8
      for (int q = 0; q < kPairs; ++q) {
        even[i][q] = _mm256_fmadd_ps(ab, we[q], even[i][q]);
        odd[i][q] = _mm256_fmadd_ps(ab, wo[q], odd[i][q]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int q = 0; q < kPairs; ++q) MergeEvenOdd(even[i][q], odd[i][q], c + i * ldc + 16 * q);
  }
}

// One vector of 8 columns at a time, widening each as loaded.
template <DType WT, int MR, int NV, bool kPrefetch>
void ChainTileVectors(const float* const* a, const void* w, int64_t ldw, int k, float* c,
                      int64_t ldc, bool accumulate) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = accumulate ? _mm256_loadu_ps(c + i * ldc + 8 * v) : _mm256_setzero_ps();
    }
  }
  const int64_t ahead = kPrefetch ? RowsInAheadBytes(ldw * ElementBytes<WT>()) : 0;
  for (int p = 0; p < k; ++p) {
    if constexpr (kPrefetch) {
      PrefetchBytes<8 * NV * ElementBytes<WT>()>(static_cast<const char*>(w) +
                                                 p * ldw * ElementBytes<WT>() + ahead);
    }
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

// c[i][0 .. 8 NV) = fma chain over p of a[i][p] * w[p][...], MR rows.
// kPrefetch: the tile reads its weights once, from memory (see DotTile).
template <DType WT, int MR, int NV, bool kPrefetch>
void ChainTile(const float* const* a, const void* w, int64_t ldw, int k, float* c, int64_t ldc,
               bool accumulate) {
  if constexpr (WT == DType::kBF16 && NV % 2 == 0) {
    ChainTileBf16Pairs<MR, NV, kPrefetch>(a, static_cast<const uint16_t*>(w), ldw, k, c, ldc,
                                          accumulate);
  } else {
    ChainTileVectors<WT, MR, NV, kPrefetch>(a, w, ldw, k, c, ldc, accumulate);
  }
}

using ChainTileFn = void (*)(const float* const*, const void*, int64_t, int, float*, int64_t, bool);

template <DType WT, int MR, int NV, bool kPrefetch>
struct ChainTiles {
  template <int... I>
  static constexpr auto Make(std::integer_sequence<int, I...>) {
    return std::array<ChainTileFn, MR * NV>{&ChainTile<WT, I / NV + 1, I % NV + 1, kPrefetch>...};
  }
  static constexpr std::array<ChainTileFn, MR* NV> kTable =
      Make(std::make_integer_sequence<int, MR * NV>());
  static ChainTileFn For(int mr, int nv) { return kTable[(mr - 1) * NV + (nv - 1)]; }
};

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
          wv = _mm256_cvtss_f32(Widen8<WT>(
              _mm_cvtsi32_si128(static_cast<const uint16_t*>(g.w.data)[p * g.w.ld + j])));
        }
        acc = FmaScalar(a[p], wv, acc);
      }
      c[j] = acc;
    }
  }
}

// Copies (widening exactly) columns [j0, j0 + 8 nv) of w's k rows into
// out[k][8 nv]: one contiguous panel instead of k strided pieces. Prefetches
// rows ahead, and each row's piece of the next panel: with few rows of `a`
// (a batch's share of an expert) the panel's compute is too short for the
// rows-ahead prefetches alone to hide memory's latency (batch-32 decode of
// the paper's shape, bf16: 1.035x).
template <DType WT>
void PackPanel(const void* w, int64_t ldw, int k, int j0, int nv, float* out) {
  for (int p = 0; p < k; ++p) {
    const char* row = static_cast<const char*>(w) + (p * ldw + j0) * ElementBytes<WT>();
    for (int line = 0; line < 8 * nv * ElementBytes<WT>(); line += 64) {
      _mm_prefetch(row + kPrefetchRows * ldw * ElementBytes<WT>() + line, _MM_HINT_T1);
      _mm_prefetch(row + 8 * nv * ElementBytes<WT>() + line, _MM_HINT_T1);
    }
    for (int v = 0; v < nv; ++v) {
      _mm256_storeu_ps(out + (p * nv + v) * 8, Load8<WT>(w, p * ldw + j0 + 8 * v));
    }
  }
}

// A rows-in product of many rows whose weights widened to f32 take at most
// this many bytes (the AVX2 build) packs them all at once, in one pass over
// w in storage order (the hardware prefetcher's best case), rather than one
// panel of columns at a time, each a strided piece of every row. Measured
// (matmul_bench FromMemory, two threads, bf16, 16 value or output experts of
// the paper's shape, 16 rows each, best of 9 alternated runs): 1.35x and
// 1.39x; f32 1.29x and 1.31x; in the cache 0.96-1.10x. engine_bench batch
// 32 bf16, four alternated rounds: 86-103 ms against 107-137 ms.
constexpr int64_t kPackWholeBytes = 512 << 10;

// Packs (widening exactly) the first 8 `vectors` columns of w's k rows into
// panels of `per_panel` vectors: panel v0 (v0 a multiple of per_panel) at
// out + k * 8 * v0, as PackPanel lays out one.
template <DType WT>
void PackPanels(const void* w, int64_t ldw, int k, int vectors, int per_panel, float* out) {
  const int64_t row_bytes = ldw * ElementBytes<WT>();
  const int used_bytes = 8 * vectors * ElementBytes<WT>();
  for (int p = 0; p < k; ++p) {
    const char* row = static_cast<const char*>(w) + p * row_bytes;
    for (int line = 0; line < used_bytes; line += 64) {
      _mm_prefetch(row + kPrefetchRows * row_bytes + line, _MM_HINT_T0);
    }
    for (int v0 = 0; v0 < vectors; v0 += per_panel) {
      const int nv = vectors - v0 < per_panel ? vectors - v0 : per_panel;
      float* o = out + static_cast<int64_t>(k) * 8 * v0 + static_cast<int64_t>(p) * nv * 8;
      for (int v = 0; v < nv; ++v) {
        _mm256_storeu_ps(o + 8 * v, Load8<WT>(w, p * ldw + 8 * (v0 + v)));
      }
    }
  }
}

// m <= MR rows: one pass over the weights, from memory. Long rows, and one
// row against short rows wider than its tile: a few weight rows at a time
// across all the tiles, so that the weights stream in order; each column's
// chain carries on through c (an f32 stored and reloaded exactly), the same
// fused multiply-adds in order. Other short rows are close to in order
// already, tile by tile. (One row of the paper shape's value experts, 112
// columns against the AVX2 build's 64-column tile, took two strided passes:
// matmul_bench FromMemory bf16, best of 5 alternated runs, one expert 0.39
// -> 0.57 of the read bandwidth, 8 experts 0.62 -> 0.86. With 2 to 4 rows
// the 24-column tiles' carries cost more than the order gains.)
template <DType WT, int MR, int NV>
void ChainFewRows(const MatmulArgs& g, int vectors) {
  const int step = static_cast<int64_t>(g.n) * ElementBytes<WT>() >= kRowsInLongRowBytes ||
                           (MR == 1 && vectors > NV)
                       ? kOneRowChainRows
                       : g.k;
  for (int p0 = 0; p0 < g.k; p0 += step) {
    const int rows = g.k - p0 < step ? g.k - p0 : step;
    const float* a[MR];
    for (int i = 0; i < g.m; ++i) a[i] = RowOfA(g, i) + p0;
    for (int v0 = 0; v0 < vectors; v0 += NV) {
      const int nv = vectors - v0 < NV ? vectors - v0 : NV;
      ChainTiles<WT, MR, NV, true>::For(g.m, nv)(a, g.w.At(p0, 8 * v0).data, g.w.ld, rows,
                                                 g.c + 8 * v0, g.ldc, g.accumulate || p0 > 0);
    }
  }
}

// A bf16 rows-in product of a few register tiles of rows (a decode step's
// share of an expert) against at most kInPlaceMaxK weight rows, each longer
// than kInPlaceBlockColumns, reads the weights in place, kInPlaceBlockColumns
// columns of every row at a time (at most 16 KiB: the register tiles of rows
// take the block in turn from the L1 cache while the next block is prefetched
// into L2). Packing them streamed the weights from memory and then computed
// on them, one after the other on each core. Measured (matmul_bench
// FromMemory, two threads, 16 output experts of the paper's shape [112,
// 1024], 16 rows each, two sets of eight alternated rounds): medians 1.30x
// and 1.23x against packing the whole matrix. The value experts' short rows
// [1024, 112] were slower in place (0.92x, in 64-row blocks of k with their
// chains carried through c), and f32 weights no faster: they are packed.
constexpr int kInPlaceMaxRows = 24;
constexpr int kInPlaceMaxK = 128;
constexpr int kInPlaceBlockColumns = 64;

// Whether RowsIn reads the weights of this product of more rows than a
// register tile in place (RowsInColumnBlocks). The AVX-512 build packs them
// for its 16-lane tiles.
template <DType WT>
bool RowsInInPlace(const MatmulArgs& g) {
#ifdef SWITCHSERVE_MATMUL_ZMM
  constexpr bool kBuild = false;
#else
  constexpr bool kBuild = true;
#endif
  return kBuild && WT == DType::kBF16 && g.m <= kInPlaceMaxRows && g.k <= kInPlaceMaxK &&
         g.n > kInPlaceBlockColumns;
}

// MatmulRowsIn over the first 8 `vectors` columns of bf16 weights, read in
// place: the same chains as ChainTile's, over all of k in one call each.
void RowsInColumnBlocks(const MatmulArgs& g, int vectors) {
  constexpr int MR = 6, NV = 2;  // ChainTileBf16Pairs: 12 accumulators
  constexpr int64_t kBytes = 2;
  const int n8 = 8 * vectors;
  const int64_t row_bytes = g.w.ld * kBytes;
  const char* w = static_cast<const char*>(g.w.data);
  const int row_tiles = (g.m + MR - 1) / MR;
  for (int j_block = 0; j_block < n8; j_block += kInPlaceBlockColumns) {
    const int cols = n8 - j_block < kInPlaceBlockColumns ? n8 - j_block : kInPlaceBlockColumns;
    // The next block's lines (one more per row where rows start mid-line), a
    // share of them after each tile of this block.
    const int next_j = j_block + kInPlaceBlockColumns;
    const int next_cols = n8 - next_j < kInPlaceBlockColumns ? n8 - next_j : kInPlaceBlockColumns;
    const bool mid_line =
        (reinterpret_cast<uintptr_t>(w + next_j * kBytes) | static_cast<uintptr_t>(row_bytes)) % 64;
    const int64_t row_lines = next_cols > 0 ? (next_cols * kBytes + 63) / 64 + mid_line : 0;
    const int64_t next_lines = row_lines * g.k;
    const int tiles = (cols / 8 + NV - 1) / NV * row_tiles;
    const int64_t lines_per_tile = (next_lines + tiles - 1) / tiles;
    int64_t line = 0;
    for (int v0 = 0; v0 < cols / 8; v0 += NV) {
      const int nv = cols / 8 - v0 < NV ? cols / 8 - v0 : NV;
      const void* tile_w = g.w.At(0, j_block + 8 * v0).data;
      for (int i0 = 0; i0 < g.m; i0 += MR) {
        const int mr = g.m - i0 < MR ? g.m - i0 : MR;
        const float* a[MR];
        for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
        ChainTiles<DType::kBF16, MR, NV, false>::For(mr, nv)(
            a, tile_w, g.w.ld, g.k, g.c + i0 * g.ldc + j_block + 8 * v0, g.ldc, g.accumulate);
        const int64_t end = line + lines_per_tile < next_lines ? line + lines_per_tile : next_lines;
        for (; line < end; ++line) {
          _mm_prefetch(w + line / row_lines * row_bytes + next_j * kBytes + 64 * (line % row_lines),
                       _MM_HINT_T1);
        }
      }
    }
  }
}

#ifdef SWITCHSERVE_MATMUL_ZMM
// ChainTile over a packed f32 panel with 16-lane vectors: each column's chain
// is a lane's, as in the 8-lane tiles. Row i's columns [0, 16 NZ) at c[i],
// where `last_mask` keeps only the first 8 columns of the last vector
// (0x00FF) or all of them. With `scale` (MatmulArgs::c_scale) the chains start
// from 0 and row i is added to c[i] times scale[i], a multiply and an add.
// kAhead: prefetches a line of `ahead` a step of k (a few rows' tile, whose
// next panel comes from memory); others take no per-step check.
template <int MR, int NZ, bool kAhead>
void ChainTileZmm(const float* const* a, const float* panel, int64_t ldp, int k, float* const* c,
                  bool accumulate, const float* scale, __mmask16 last_mask, PrefetchLines* ahead) {
  const auto mask = [&](int z) { return z == NZ - 1 ? last_mask : static_cast<__mmask16>(0xFFFF); };
  __m512 acc[MR][NZ];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int z = 0; z < NZ; ++z) {
      acc[i][z] = accumulate ? _mm512_maskz_loadu_ps(mask(z), c[i] + 16 * z) : _mm512_setzero_ps();
    }
  }
  for (int p = 0; p < k; ++p) {
    if constexpr (kAhead) ahead->Next();
    __m512 wv[NZ];
#pragma GCC unroll 8
    for (int z = 0; z < NZ; ++z) wv[z] = _mm512_maskz_loadu_ps(mask(z), panel + p * ldp + 16 * z);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 ab = _mm512_set1_ps(a[i][p]);
#pragma GCC unroll 8
      for (int z = 0; z < NZ; ++z) acc[i][z] = _mm512_fmadd_ps(ab, wv[z], acc[i][z]);
    }
  }
  if (scale != nullptr) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 s = _mm512_set1_ps(scale[i]);
#pragma GCC unroll 8
      for (int z = 0; z < NZ; ++z) {
        acc[i][z] = _mm512_add_ps(_mm512_maskz_loadu_ps(mask(z), c[i] + 16 * z),
                                  _mm512_mul_ps(s, acc[i][z]));
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int z = 0; z < NZ; ++z) _mm512_mask_storeu_ps(c[i] + 16 * z, mask(z), acc[i][z]);
  }
}

// Rows of k a packed panel of the 16-lane rows-in tiles holds at a time (all
// of k up to kZmmInWholeK): 64 columns of f32 in 16 KiB, which the widening
// writes into the L1 cache and every row tile then reads from there, where
// a whole panel of k = 1024 (256 KiB) went to L2 and back for each row tile.
// Each column's chain carries on through c (an f32 stored and reloaded
// exactly). Intel Xeon VM (AVX-512), matmul_bench, one thread, three
// alternated rounds: the value experts [1024, 112], 16 rows 44.7-46.5 ->
// 35.4 us (bf16), 256 rows 488-489 -> 446-449; f32 alike; k = 112 unchanged.
constexpr int kZmmInBlockK = 64;
constexpr int kZmmInWholeK = 128;
constexpr int kZmmInRows = 6;     // 24 accumulators, 4 weight vectors, 1 broadcast
constexpr int kZmmInVectors = 4;  // 64 columns: a panel of 8 8-lane vectors

using ChainTileZmmFn = void (*)(const float* const*, const float*, int64_t, int, float* const*,
                                bool, const float*, __mmask16, PrefetchLines*);

template <bool kAhead, int... I>
constexpr std::array<ChainTileZmmFn, sizeof...(I)> MakeChainTilesZmm(
    std::integer_sequence<int, I...>) {
  return {&ChainTileZmm<I / kZmmInVectors + 1, I % kZmmInVectors + 1, kAhead>...};
}
// kChainTilesZmm[ahead][(mr - 1) * kZmmInVectors + nz - 1] =
// ChainTileZmm<mr, nz, ahead>.
constexpr std::array<ChainTileZmmFn, kZmmInRows * kZmmInVectors> kChainTilesZmm[2] = {
    MakeChainTilesZmm<false>(std::make_integer_sequence<int, kZmmInRows * kZmmInVectors>()),
    MakeChainTilesZmm<true>(std::make_integer_sequence<int, kZmmInRows * kZmmInVectors>())};

// Products of up to this many rows (a decode step's share of an expert) take
// their panels a block of k at a time and prefetch the next one
// (RowsInPanelsZmm); more rows reuse each panel long enough for the hardware
// prefetcher, and took 1.05x and 1.08x as long that way in the cache
// (matmul_bench, one thread, 256 rows of the value and output experts).
constexpr int kPrefetchPanelMaxRows = 32;

// MatmulRowsIn of more rows than a register tile over the first 8 `vectors`
// columns, with the 16-lane tiles: each panel of weights (kPanel vectors of
// columns, block_k rows of k) packed and then taken by every register tile
// of a block of kRowBlock rows. A few rows (kPrefetchPanelMaxRows) take a
// block of k's panels one after the other, so that its weight rows are read
// whole and in order, and prefetch the next panel's lines while the tiles
// compute (PrefetchLines); more rows take all of a panel's blocks of k
// before the next panel. matmul_bench FromMemory, bf16, 16 experts of 16
// rows (a batch-32 decode step's value and output experts), the Intel Xeon
// (Emerald Rapids) VM, five alternated runs, medians: value experts [1024,
// 112] 494 -> 388 us, output experts [112, 1024] 394 -> 370 us.
template <DType WT>
void RowsInPanelsZmm(const MatmulArgs& g, int vectors) {
  constexpr int kPanel = 2 * kZmmInVectors;  // 8-lane vectors per panel
  const int block_k = g.k <= kZmmInWholeK ? g.k : kZmmInBlockK;
  float* panel = WidenBuffer().Reserve(static_cast<size_t>(8 * kPanel) * block_k);
  const int panels = (vectors + kPanel - 1) / kPanel;
  const int blocks = (g.k + block_k - 1) / block_k;
  const int steps = blocks * panels;
  const bool few_rows = g.m <= kPrefetchPanelMaxRows;
  // Panel `step`'s first vector and row of k, and its size: a few rows take
  // a block of k's panels one after the other (each block's weight rows read
  // whole, in order), more rows all of a panel's blocks of k before the next
  // panel (the block of c they carry their chains through stays in L1).
  struct Panel {
    int v0, p0, nv, kk;
  };
  const auto panel_at = [&](int step) {
    Panel p;
    p.v0 = (few_rows ? step % panels : step / blocks) * kPanel;
    p.p0 = (few_rows ? step / panels : step % blocks) * block_k;
    p.nv = vectors - p.v0 < kPanel ? vectors - p.v0 : kPanel;
    p.kk = g.k - p.p0 < block_k ? g.k - p.p0 : block_k;
    return p;
  };
  // With one block of k (no chain carried through c) every row takes a
  // panel before the next, which is then packed once rather than once per
  // kRowBlock rows: a 512-token prefill's output experts (engine_bench, bf16,
  // their time over the value experts' in the same steps, three alternated
  // runs on the Intel Xeon (Emerald Rapids) VM): 1.10-1.13 -> 1.03-1.07.
  const int row_block = blocks == 1 ? g.m : kRowBlock;
  for (int i_block = 0; i_block < g.m; i_block += row_block) {
    const int i_end = g.m < i_block + row_block ? g.m : i_block + row_block;
    for (int step = 0; step < steps; ++step) {
      const Panel p = panel_at(step);
      const int nz = (p.nv + 1) / 2;
      const __mmask16 last_mask = p.nv % 2 == 0 ? 0xFFFF : 0x00FF;
      PackPanel<WT>(g.w.At(p.p0, 0).data, g.w.ld, p.kk, 8 * p.v0, p.nv, panel);
      PrefetchLines ahead;
      if (few_rows && step + 1 < steps) {
        const Panel next = panel_at(step + 1);
        ahead =
            PrefetchLines(static_cast<const char*>(g.w.At(next.p0, 8 * next.v0).data),
                          g.w.ld * ElementBytes<WT>(), 8 * next.nv * ElementBytes<WT>(), next.kk);
      }
      for (int i0 = i_block; i0 < i_end; i0 += kZmmInRows) {
        const int mr = i_end - i0 < kZmmInRows ? i_end - i0 : kZmmInRows;
        const float* a[kZmmInRows];
        float* c[kZmmInRows];
        for (int i = 0; i < mr; ++i) {
          a[i] = RowOfA(g, i0 + i) + p.p0;
          c[i] = RowOfC(g, i0 + i) + 8 * p.v0;
        }
        kChainTilesZmm[few_rows][(mr - 1) * kZmmInVectors + nz - 1](
            a, panel, 8 * p.nv, p.kk, c, g.c_scale == nullptr && (g.accumulate || p.p0 > 0),
            g.c_scale != nullptr ? g.c_scale + i0 : nullptr, last_mask, &ahead);
      }
    }
  }
}
#endif  // SWITCHSERVE_MATMUL_ZMM

// Whether RowsIn adds a scaled product (MatmulArgs::c_scale) from its tiles'
// registers: the 16-lane panels' tiles, where all of k is one pass (no chain
// carried through c) and every column is in a vector.
template <DType WT>
bool ScalesInTiles(const MatmulArgs& g) {
#ifdef SWITCHSERVE_MATMUL_ZMM
  return g.m > Tiles::kInRows && !RowsInInPlace<WT>(g) && g.k <= kZmmInWholeK && g.n % 8 == 0;
#else
  (void)g;
  return false;
#endif
}

template <DType WT>
void RowsIn(const MatmulArgs& g) {
  if (g.w.tiling == Tiling::kColumnPanels) return ForEachPanel(g, RowsIn<WT>);
  if (g.c_scale != nullptr && !ScalesInTiles<WT>(g)) return AddScaledProduct(g, RowsIn<WT>);
  const int n8 = g.n & ~7;
  const int vectors = n8 / 8;
  constexpr int MR = Tiles::kInRows, NV = Tiles::kInVectors;
  if (g.m == 1 && static_cast<int64_t>(g.n) * ElementBytes<WT>() < kRowsInLongRowBytes) {
    ChainFewRows<WT, 1, Tiles::kOneRowShortInVectors>(g, vectors);
  } else if (g.m == 1) {
    ChainFewRows<WT, 1, Tiles::kOneRowInVectors>(g, vectors);
  } else if (g.m <= MR) {
    ChainFewRows<WT, MR, NV>(g, vectors);
  } else if (RowsInInPlace<WT>(g)) {
    RowsInColumnBlocks(g, vectors);
  } else {
    // Many rows reuse each panel of weights: pack it contiguously (and
    // widened) once.
#ifdef SWITCHSERVE_MATMUL_ZMM
    RowsInPanelsZmm<WT>(g, vectors);
#else
    // The whole matrix packed at once where it fits (kPackWholeBytes), else
    // one panel at a time.
    const int64_t whole = static_cast<int64_t>(g.k) * n8;
    const bool pack_whole = whole * static_cast<int64_t>(sizeof(float)) <= kPackWholeBytes;
    const int64_t panel_floats = pack_whole ? whole : static_cast<int64_t>(8 * NV) * g.k;
    float* panel = WidenBuffer().Reserve(static_cast<size_t>(panel_floats));
    if (pack_whole) PackPanels<WT>(g.w.data, g.w.ld, g.k, vectors, NV, panel);
    for (int i_block = 0; i_block < g.m; i_block += kRowBlock) {
      const int i_end = g.m < i_block + kRowBlock ? g.m : i_block + kRowBlock;
      for (int v0 = 0; v0 < vectors; v0 += NV) {
        const int nv = vectors - v0 < NV ? vectors - v0 : NV;
        const float* pv = panel;
        if (pack_whole) {
          pv += static_cast<int64_t>(g.k) * 8 * v0;
        } else {
          PackPanel<WT>(g.w.data, g.w.ld, g.k, 8 * v0, nv, panel);
        }
        for (int i0 = i_block; i0 < i_end; i0 += MR) {
          const int mr = i_end - i0 < MR ? i_end - i0 : MR;
          const float* a[MR];
          for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
          ChainTiles<DType::kF32, MR, NV, false>::For(mr, nv)(
              a, pv, 8 * nv, g.k, g.c + i0 * g.ldc + 8 * v0, g.ldc, g.accumulate);
        }
      }
    }
#endif
  }
  if (n8 < g.n) ChainColumnsScalar<WT>(g, n8);
}

}  // namespace
}  // namespace switchserve::cpu
