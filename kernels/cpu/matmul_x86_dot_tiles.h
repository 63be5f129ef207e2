// Part of matmul_x86_kernels.h: MatmulRowsOut's 8-lane register tiles
// (DotTile: widening, reduction and prefetching as it reads).
// Included by that file only, in its order (each part uses the ones
// before it); no include guard, internal linkage, as that file says.

namespace switchserve::cpu {
namespace {

// ---- MatmulRowsOut ----

// Row j of w's first element (either layout, matmul.h).
template <DType WT>
inline const char* RowStart(const WeightMatrix& w, int64_t j) {
  const int64_t at = w.tiling == Tiling::kRowBlocks ? TiledOffset(w.first + j, w.ld) : j * w.ld;
  return static_cast<const char*>(w.data) + at * ElementBytes<WT>();
}

// Bytes from one group of 8 elements of a row to the next.
template <DType WT>
constexpr int64_t GroupBytes(bool tiled) {
  return (tiled ? 8 * kTileRows : 8) * ElementBytes<WT>();
}

// How far ahead of its reads a tile of tiled weights prefetches: the block's
// groups are one stream, which the hardware prefetcher alone follows slower
// (measured on an AMD EPYC (Zen 3) VM, two threads, one row of the paper
// shape's q projection and FFN down projections, bf16: 1 KiB ahead 0.81-0.96
// of the read bandwidth, 2 KiB 0.91-1.07, 4 KiB 0.91-1.14, none 0.78-0.92).
// On an AMD EPYC (Zen 4) VM, AVX-512 build, bf16 (matmul_bench FromMemory,
// one row, medians of six alternated pairs): 4 KiB 1.15-1.22x faster than
// 2 KiB for q, the FFN's down projections and the output head; 8 KiB no
// faster than 4 KiB. The paper shape's bf16 batch-1 step 1.13x.
// None (the hardware prefetcher alone) against 4 KiB, AVX-512 build, on the Zen
// 4 VM (matmul_bench FromMemory, one row, tiled, 40 processes per distance
// alternated, each followed by a read-bandwidth probe): where that VM's plain
// streaming read ran at 33-36 GB/s, none streamed the output head and q as fast
// as 4 KiB ahead (bf16 medians 33.9 / 33.0 and 31.5 / 31.9 GB/s; f32 alike);
// where it ran at 55-64 GB/s (the host had placed the two vCPUs apart, each
// core with a memory link of its own: bench/roofline.h), faster (bf16 51.7 /
// 40.6 and 38.7 / 34.5 GB/s). 2 KiB was the slowest of the three in both.
// On an Intel Xeon VM with AVX-512 (2.6 GHz, 2 MiB L2 a core, streaming read
// 33-35 GB/s), 4 KiB ahead against none, AVX-512 build, bf16 (matmul_bench
// FromMemory, one row, tiled, three alternated rounds): 1.39-1.44x for q, one
// and four of the FFN's up and down projections, 1.15x for the output head; the
// paper shape's bf16 batch-1 step 1.2x (engine_bench). So the AVX-512 build
// prefetches ahead on Intel CPUs only (TiledAhead).
constexpr int64_t kTiledAheadBytes = 4096;

// Whether this build's tiled tiles prefetch kTiledAheadBytes ahead of their
// reads (DotTiles::For), else leave the stream to the hardware prefetcher.
inline bool TiledAhead() {
#ifdef SWITCHSERVE_MATMUL_ZMM
  return IntelCpu();
#else
  return true;
#endif
}

// c[i][j] = alpha * dot8(a row i, w row j) (+ c[i][j] when accumulating) for
// an MR x NR tile: the sum rounded, times alpha rounded, plus c rounded, the
// same roundings whatever the tile. kPrefetch: the tile reads its weights
// once, from memory (a tile that many rows share re-reads them from the
// cache, where prefetching the next tile's would evict them). kTiled: w in row
// blocks (matmul.h); the same products in the same order.
template <DType WT, int MR, int NR, bool kPrefetch, bool kTiled>
void DotTile(const float* const* a, const WeightMatrix& w, int k, float* c, int64_t ldc,
             float alpha, bool accumulate) {
  constexpr int64_t kGroup = GroupBytes<WT>(kTiled);
  const char* row[NR];
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) row[j] = RowStart<WT>(w, j);
  // Tiled: the stream of the block that holds the first row,
  // kTiledAheadBytes on (row-major tiles prefetch the next tile's rows).
  constexpr bool kTiledAhead = kPrefetch && kTiled;
  const char* ahead = nullptr;
  if constexpr (kTiledAhead && NR == kTileRows) {
    ahead = RowStart<WT>(w, -(w.first % kTileRows)) + kTiledAheadBytes;
  }
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int k8 = k & ~7;
  for (int p = 0; p < k8; p += 8) {
    const int64_t at = p / 8 * kGroup;
    if constexpr (kTiledAhead && NR == kTileRows) {
      // A block's worth of rows (one row's tiles): its whole group, further
      // on in the block's stream. Several rows' tiles keep their inputs in
      // the L1 cache: fetch into L2.
#pragma GCC unroll 8
      for (int64_t line = 0; line < kGroup; line += 64) {
        _mm_prefetch(ahead + at + line, _MM_HINT_T1);
      }
    } else if constexpr (kTiledAhead) {
      // Fewer rows, which may lie in two blocks: each row's piece, further on
      // in its block's stream.
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm_prefetch(row[j] + at + kTiledAheadBytes, _MM_HINT_T1);
    } else if (kPrefetch && !kTiled && ((p * ElementBytes<WT>()) & 63) == 0) {
      // The rows of a row-major matrix are short streams (0.5-4 KiB) that
      // the hardware prefetcher picks up late: fetch the next tile's rows,
      // one cache line each per line consumed here.
      const int64_t next_rows = NR * w.ld * ElementBytes<WT>();
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm_prefetch(row[j] + next_rows + at, _MM_HINT_T1);
    }
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = Load8<WT>(row[j] + at, 0);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_loadu_ps(a[i] + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, wv[j], acc[i][j]);
    }
  }
  if (k8 < k) {
    const int rest = k - k8;
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = LoadPartial8<WT>(row[j] + k8 / 8 * kGroup, 0, rest);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 av = LoadPartial8<DType::kF32>(a[i], k8, rest);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, wv[j], acc[i][j]);
    }
  }
  // Eight accumulators reduced at a time: a row's eight columns stored
  // straight from the vector, or else the tile's accumulators in row order
  // (the last four or fewer by Reduce4x8) through a buffer. At k = 128 the
  // reductions are a third of a 4 x 3 tile's time (matmul_bench): two
  // Reduce4x8 take twice the shuffles of one Reduce8x8.
  const __m256 alpha8 = _mm256_set1_ps(alpha);
  if constexpr (NR % 8 == 0) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; j += 8) {
        const __m256* v = &acc[i][j];
        __m256 sums =
            _mm256_mul_ps(alpha8, Reduce8x8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]));
        if (accumulate) sums = _mm256_add_ps(_mm256_loadu_ps(c + i * ldc + j), sums);
        _mm256_storeu_ps(c + i * ldc + j, sums);
      }
    }
  } else {
    constexpr int kSums = MR * NR;
    alignas(32) float sums[(kSums + 7) / 8 * 8];
    const __m256 zero = _mm256_setzero_ps();
    const auto at = [&](int t) { return t < kSums ? acc[t / NR][t % NR] : zero; };
#pragma GCC unroll 8
    for (int t = 0; t < kSums; t += 8) {
      if (kSums - t > 4) {
        _mm256_store_ps(
            sums + t, _mm256_mul_ps(alpha8, Reduce8x8(at(t), at(t + 1), at(t + 2), at(t + 3),
                                                      at(t + 4), at(t + 5), at(t + 6), at(t + 7))));
      } else {
        _mm_store_ps(sums + t, _mm_mul_ps(_mm256_castps256_ps128(alpha8),
                                          Reduce4x8(at(t), at(t + 1), at(t + 2), at(t + 3))));
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        c[i * ldc + j] = accumulate ? c[i * ldc + j] + sums[i * NR + j] : sums[i * NR + j];
      }
    }
  }
}

using DotTileFn = void (*)(const float* const*, const WeightMatrix&, int, float*, int64_t, float,
                           bool);

// kTable[tiled][mr - 1][nr - 1] = DotTile<WT, mr, nr, kPrefetch, tiled>;
// For: tiled weights without prefetching where TiledAhead() says so (a tiled
// tile prefetches nothing else).
template <DType WT, int MR, int NR, bool kPrefetch>
struct DotTiles {
  template <bool kTiled, int... I>
  static constexpr auto Make(std::integer_sequence<int, I...>) {
    return std::array<DotTileFn, MR * NR>{
        &DotTile<WT, I / NR + 1, I % NR + 1, kPrefetch, kTiled>...};
  }
  static constexpr std::array<DotTileFn, MR * NR> kTable[2] = {
      Make<false>(std::make_integer_sequence<int, MR * NR>()),
      Make<true>(std::make_integer_sequence<int, MR * NR>())};
  static DotTileFn For(const WeightMatrix& w, int mr, int nr) {
    const bool tiled = w.tiling == Tiling::kRowBlocks;
    if (kPrefetch && tiled && !TiledAhead()) return DotTiles<WT, MR, NR, false>::For(w, mr, nr);
    return kTable[tiled][(mr - 1) * NR + (nr - 1)];
  }
};

}  // namespace
}  // namespace switchserve::cpu
