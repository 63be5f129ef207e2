// The x86 kernels of matmul.h, written once and compiled twice: by
// matmul_avx2.cc (16 vector registers) and matmul_avx512.cc (AVX-512: 32
// registers, larger register tiles, and with SWITCHSERVE_MATMUL_ZMM 16-lane
// tiles for products of many rows). Both builds compute every element with
// the same fused multiply-adds in the same order, so they give the same bits;
// only the tiling and the vector width differ.
//
// Included by those files only, after their target pragma and after they
// define, in namespace switchserve::cpu::{anonymous}, `struct Tiles` with
//   kOutRows x kOutCols   register tile of MatmulRowsOut (accumulators)
//   kOneRowOutCols        its width when a single row is computed (decode)
//   kInRows x kInVectors  register tile of MatmulRowsIn (vectors of 8 columns)
//   kOneRowInVectors      its width for a single row
//   kOneRowShortInVectors its width for a single row against short weight
//                         rows (under kRowsInLongRowBytes), so that one
//                         pass reads each weight row whole.
// Everything here has internal linkage. No include guard: each including file
// compiles its own copy.
//
// Half-precision weights are widened in registers (bf16: a 16-bit shift, or
// for two vectors of columns at once a shift and a mask; f16: vcvtph2ps), or,
// where many rows reuse them in MatmulRowsIn (and in the AVX-512 build's
// 16-lane MatmulRowsOut tiles), into a thread-local f32 buffer, a panel at a
// time or (AVX2 MatmulRowsIn, matrices up to kPackWholeBytes widened) all at
// once (except a few rows of bf16 against short k, RowsInColumnBlocks):
// widening is exact, so all give the same bits.
//
// Decode tiles read each weight once, from memory, in short pieces of many
// rows; they prefetch the rows they will read next (tiled ones further on
// in their stream: the AVX2 build's always, the AVX-512 build's on Intel
// CPUs, TiledAhead), and so do the loops that widen or pack a tile of
// weights for many rows, and the AVX-512 build's rows-in tiles of a few rows,
// for the panel they take next (PrefetchLines). Prefetches change no
// arithmetic.

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "kernels/cpu/matmul.h"

namespace switchserve::cpu {
namespace {

// Rows of `a` processed against one tile of weights before moving on, so that
// they stay in the L2 cache.
constexpr int kRowBlock = 64;

// How many rows ahead a MatmulRowsIn tile reading from memory prefetches,
// and how many weight rows a few rows' product takes across all the columns
// before the next ones.
constexpr int kPrefetchRows = 6;
constexpr int kOneRowChainRows = 8;

// Products of up to this many MatmulRowsOut register tiles of rows read each
// weight tile from memory once, in the first row tile (prefetching the next
// weight tile), and again from the L1 cache in the others, widening bf16 in
// registers each time. More rows take the weights a larger column block at a
// time (RowsOutColumnBlocks; the AVX-512 build's 16-lane tiles from 12 rows
// on).
// The threshold was measured against widening each weight tile into a buffer,
// the many-row path before column blocks (matmul_bench FromMemory, 32 FFN
// experts of 6 or 8 rows, bf16 and f32): 1.1-1.4x from 5 rows on.
constexpr int kColumnBlockMinRowTiles = 3;

// Whether this is an Intel CPU, whose hardware prefetchers run less far ahead
// of a weight stream than the AMD ones the distances below were first
// measured on (TiledAhead, RowsInAheadBytes).
inline bool IntelCpu() {
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
}

// On Intel CPUs a MatmulRowsIn tile reading from memory prefetches at least
// this far ahead: kPrefetchRows rows of a short row (a panel's 64 columns,
// the value experts' 112) are under 1.5 KiB. Intel Xeon VM with AVX-512 (2.6
// GHz, 2 MiB L2 a core, streaming read 33-35 GB/s), matmul_bench FromMemory,
// one row, eight matrices, three alternated rounds, 2 KiB against kPrefetchRows
// rows: the SwitchHead output experts [112, 1024] in panels, bf16 63.6-65.7
// against 72.9-76.8 us; the value experts [1024, 112] as stored, bf16
// 59.5-64.9 against 65.0-66.5; f32 within the spread (4 KiB: bf16 alike, f32
// up to 1.13x slower).
constexpr int64_t kRowsInAheadMinBytes = 2048;

// How far ahead of the row it reads a MatmulRowsIn tile prefetches: a tile of
// a few rows reads a short piece of each of k rows, a strided pattern the
// hardware prefetcher follows late.
inline int64_t RowsInAheadBytes(int64_t row_bytes) {
  const int64_t rows = kPrefetchRows * row_bytes;
  return IntelCpu() && rows < kRowsInAheadMinBytes ? kRowsInAheadMinBytes : rows;
}

// Prefetches `kBytes` from `at` on. Prefetches go to the L2 cache: fetched
// into L1 they evicted the lines the tile was still reading (measured: up to
// 1.5x slower than into L2).
template <int kBytes>
inline void PrefetchBytes(const char* at) {
#pragma GCC unroll 8
  for (int line = 0; line < kBytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T1);
}

// The cache lines of `rows` rows of `row_bytes` bytes, `stride` bytes apart,
// prefetched into the L2 cache one line a call to Next(): a tile calls it
// once a step of k, so that the lines a product reads next arrive while the
// core computes on the ones before (RowsInPanelsZmm). Two lines a step were
// slower than one (engine_bench batch 32, the value experts' time over the
// FFN's in the same steps: 0.44-0.47 against 0.42-0.45).
class PrefetchLines {
 public:
  PrefetchLines() = default;
  PrefetchLines(const char* first_row, int64_t stride, int64_t row_bytes, int rows)
      : row_(first_row), stride_(stride), row_bytes_(row_bytes), rows_left_(rows) {
    StartRow();
  }

  void Next() {
    if (rows_left_ <= 0) return;
    _mm_prefetch(line_, _MM_HINT_T1);
    line_ += 64;
    if (line_ >= row_end_) NextRow();
  }

 private:
  void StartRow() {
    line_ = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row_) & ~uintptr_t{63});
    row_end_ = row_ + row_bytes_;
  }
  void NextRow() {
    row_ += stride_;
    --rows_left_;
    StartRow();
  }

  const char* row_ = nullptr;
  const char* line_ = nullptr;  // the next line to prefetch, in row_
  const char* row_end_ = nullptr;
  int64_t stride_ = 0;
  int64_t row_bytes_ = 0;
  int rows_left_ = 0;  // row_'s included
};

template <DType WT>
constexpr int ElementBytes() {
  return WT == DType::kF32 ? 4 : 2;
}

// Eight 16-bit weights, widened exactly.
template <DType WT>
inline __m256 Widen8(__m128i h) {
  static_assert(WT != DType::kF32);
  if constexpr (WT == DType::kBF16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

template <DType WT>
inline __m256 Load8(const void* base, int64_t index) {
  if constexpr (WT == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else {
    return Widen8<WT>(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index)));
  }
}

// The first `count` (< 8) elements from `index` on, the other lanes zero;
// reads no byte past them. Masked loads: a copy through a stack buffer cost
// a library call and a stalled store-to-load forward per tile: with k = 28
// (the built-in model's FFN down projection) the one-row tiles took about a
// third of the engine thread's time at one client, mostly in those copies.
template <DType WT>
inline __m256 LoadPartial8(const void* base, int64_t index, int count) {
  if constexpr (WT == DType::kF32) {
    const __m256i keep =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(static_cast<const float*>(base) + index, keep);
  } else {
    // The whole 32-bit pairs by a masked load; an odd last element, the low
    // half of the next pair, on its own.
    const uint16_t* p = static_cast<const uint16_t*>(base) + index;
    const __m128i pairs = _mm_set1_epi32(count >> 1);
    const __m128i lanes = _mm_setr_epi32(0, 1, 2, 3);
    __m128i h = _mm_maskload_epi32(reinterpret_cast<const int*>(p), _mm_cmpgt_epi32(pairs, lanes));
    if (count & 1) {
      h = _mm_blendv_epi8(h, _mm_set1_epi32(p[count - 1]), _mm_cmpeq_epi32(pairs, lanes));
    }
    return Widen8<WT>(h);
  }
}

// The dot8 sums of four accumulators, [r0, r1, r2, r3], each
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) of its own lanes.
inline __m128 Reduce4x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(v0), _mm256_extractf128_ps(v0, 1));
  const __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(v1), _mm256_extractf128_ps(v1, 1));
  const __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(v2), _mm256_extractf128_ps(v2, 1));
  const __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(v3), _mm256_extractf128_ps(v3, 1));
  return _mm_hadd_ps(_mm_hadd_ps(s0, s1), _mm_hadd_ps(s2, s3));
}

// [lo | hi]: lanes l0 + l4, l1 + l5, l2 + l6, l3 + l7 of each.
inline __m256 AddHalves(__m256 lo, __m256 hi) {
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

// The dot8 sums of eight accumulators, [r0 .. r7]: each Reduce4x8's tree of
// its own lanes, for all eight at once (half the shuffles of two Reduce4x8).
inline __m256 Reduce8x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
                        __m256 v7) {
  // hadd adds neighbours within each 128-bit half: r0 r1 r2 r3 | r4 r5 r6 r7.
  return _mm256_hadd_ps(_mm256_hadd_ps(AddHalves(v0, v4), AddHalves(v1, v5)),
                        _mm256_hadd_ps(AddHalves(v2, v6), AddHalves(v3, v7)));
}

inline float FmaScalar(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

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

// A thread's scratch floats, reused across calls, starting on a cache line:
// a 16-lane load or store at a multiple of 16 floats from it (packed pairs,
// carried accumulators) never spans two lines. Unaligned, three of every four
// did. What it holds does not survive a Reserve that grows it.
class LineAlignedScratch {
 public:
  float* Reserve(size_t floats) {
    if (floats > capacity_) {
      data_.reset(static_cast<float*>(::operator new[](floats * sizeof(float), kAlign)));
      capacity_ = floats;
    }
    return data_.get();
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, kAlign); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t capacity_ = 0;
};

// Thread-local f32 copy of a tile of weights.
LineAlignedScratch& WidenBuffer() {
  thread_local LineAlignedScratch buffer;
  return buffer;
}

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

// Whether one row's rows-out tiles prefetch the weights they read next (the
// next tile's rows, or further on in a tiled block). In the AVX2 build, f32
// weights stream faster without, from the hardware prefetcher alone:
// matmul_bench FromMemory on an AMD EPYC (Zen 3) VM, two threads, one row,
// medians of 8 repetitions interleaved in one process, 1.09-1.29x for q, the
// FFN's up and down projections (one and four experts) and the output head
// row-major; tiled, 0.76-0.86 of the read bandwidth with, 0.77-0.96 without
// against k = 1024, 0.75-0.81 with and 0.80-0.93 without against k = 128.
// bf16 weights stream faster with it (row-major: 0.66-0.84 of the read
// bandwidth against 0.50-0.63 without, in most runs). The AVX-512 build keeps
// it for both row-major (not measured there); its tiled tiles prefetch on
// Intel CPUs only (TiledAhead).
template <DType WT>
constexpr bool kOneRowPrefetch =
#ifdef SWITCHSERVE_MATMUL_ZMM
    true;
#else
    WT != DType::kF32;
#endif

template <DType WT>
void RowsOutOneRow(const MatmulArgs& g) {
  constexpr int kCols = Tiles::kOneRowOutCols;
  const float* a[1] = {RowOfA(g, 0)};
  for (int j0 = 0; j0 < g.n; j0 += kCols) {
    const int nr = g.n - j0 < kCols ? g.n - j0 : kCols;
    const WeightMatrix w = g.w.At(j0, 0);
    DotTiles<WT, 1, kCols, kOneRowPrefetch<WT>>::For(w, 1, nr)(a, w, g.k, g.c + j0, g.ldc, g.alpha,
                                                               g.accumulate);
  }
}

// Weight bytes of one column block of a rows-out product of many rows: most
// of the L2 cache, with room for the rows of `a` passing through.
constexpr int64_t kOutColumnBlockBytes = 192 << 10;

// MatmulRowsOut with the 8-lane tiles, `block_cols` (a multiple of NR) columns
// of weights at a time: each register tile of rows takes the block's columns
// in turn, the first row tile reading them from memory (prefetching the next
// tile's) and the others from the cache, half precision widened in registers.
// A few rows take one weight tile per block, so that it stays in the L1 cache
// for them. Many rows take a block of up to kOutColumnBlockBytes, which stays
// in the L2 cache while each row tile's inputs stay in L1: per multiply-add
// step a tile then reads its NR weight vectors from L2 and its MR input
// vectors from L1, rather than the other way round (the inputs, being more,
// are the stream the L2 cache could not feed).
template <DType WT>
void RowsOutColumnBlocks(const MatmulArgs& g, int block_cols) {
  constexpr int MR = Tiles::kOutRows, NR = Tiles::kOutCols;
  for (int j_block = 0; j_block < g.n; j_block += block_cols) {
    const int j_end = g.n < j_block + block_cols ? g.n : j_block + block_cols;
    for (int i0 = 0; i0 < g.m; i0 += MR) {
      const int mr = g.m - i0 < MR ? g.m - i0 : MR;
      const float* a[MR];
      for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
      for (int j0 = j_block; j0 < j_end; j0 += NR) {
        const int nr = j_end - j0 < NR ? j_end - j0 : NR;
        const WeightMatrix w = g.w.At(j0, 0);
        float* c = g.c + i0 * g.ldc + j0;
        if (i0 == 0) {
          DotTiles<WT, MR, NR, true>::For(w, mr, nr)(a, w, g.k, c, g.ldc, g.alpha, g.accumulate);
        } else {
          DotTiles<WT, MR, NR, false>::For(w, mr, nr)(a, w, g.k, c, g.ldc, g.alpha, g.accumulate);
        }
      }
    }
  }
}

#ifdef SWITCHSERVE_MATMUL_ZMM
// MatmulRowsOut for a few rows: one tile of 8 columns of weights at a time,
// which every row tile takes in turn, the first from memory (prefetching the
// next tile's rows) and the others from the L1 cache. Columns past the last
// whole tile take the 8-lane tiles (RowsOutColumnBlocks).
template <DType WT>
void RowsOutFewRows(const MatmulArgs& g) {
  constexpr int kCols = 2 * kPairCols;
  const int whole = g.n / kCols * kCols;
  for (int j0 = 0; j0 < whole; j0 += kCols) {
    const WeightMatrix w = g.w.At(j0, 0);
    for (int i0 = 0; i0 < g.m; i0 += kFewPairRows) {
      const int mr = g.m - i0 < kFewPairRows ? g.m - i0 : kFewPairRows;
      const float* a[kFewPairRows];
      for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
      const DotTileFn tile =
          i0 == 0 ? FewPairTiles<WT, true>::For(w, mr) : FewPairTiles<WT, false>::For(w, mr);
      tile(a, w, g.k, g.c + i0 * g.ldc + j0, g.ldc, g.alpha, g.accumulate);
    }
  }
  if (whole == g.n) return;
  MatmulArgs rest = g;
  rest.n = g.n - whole;
  rest.c = g.c + whole;
  rest.w = g.w.At(whole, 0);
  RowsOutColumnBlocks<WT>(rest, Tiles::kOutCols);
}
#endif

template <DType WT>
void RowsOut(const MatmulArgs& g) {
  if (g.c_scale != nullptr) return AddScaledProduct(g, RowsOut<WT>);
  if (g.m == 1) return RowsOutOneRow<WT>(g);
  constexpr int MR = Tiles::kOutRows, NR = Tiles::kOutCols;
#ifdef SWITCHSERVE_MATMUL_ZMM
  // From two full 16-lane row tiles on, weights packed into pairs. Fewer
  // rows (a decode step's projections and experts at small batches) read
  // them in place (packing a tile that few rows share cost more than it
  // saved: 1.4-1.5x as long for bf16 experts of 4 rows): in pairs where the
  // weight rows are short, whose products the multiply-adds bound (the FFN's
  // down projections, k 128), or where there is more than one tile of rows;
  // with the 8-lane tiles where one tile of rows takes long weight rows,
  // whose products stream (32 bf16 experts of 4 rows, matmul_bench FromMemory
  // on an AMD EPYC Zen 5 VM: k 128 1.25x faster in pairs, k 1024 1.15x
  // slower). With two or three tiles of rows the 8-lane tiles' multiply-adds
  // bound long rows too: on the Intel Xeon (Emerald Rapids) VM, 32 bf16
  // experts [128, 1024] of 8 rows from memory took 847 us with them, 663 in
  // pairs (matmul_bench FromMemory, medians of five alternated runs); in
  // engine_bench, batch 8, the q and k projections 0.92x as long and batch
  // 32's FFN 0.97x (each against the value experts' time in the same steps,
  // three alternated runs).
  if (g.m >= 2 * kPairRows) return RowsOutManyRows<WT>(g);
  if (static_cast<int64_t>(g.k) * ElementBytes<WT>() < kRowsInLongRowBytes || g.m > kFewPairRows) {
    return RowsOutFewRows<WT>(g);
  }
#endif
  // Tiled weights a block at a time, so that no register tile's rows lie in
  // two blocks.
  if (g.m <= kColumnBlockMinRowTiles * MR) {
    return RowsOutColumnBlocks<WT>(g, g.w.tiling == Tiling::kRowBlocks ? kTileRows : NR);
  }
  const int64_t row_bytes = static_cast<int64_t>(g.k) * ElementBytes<WT>();
  const int block_cols = static_cast<int>(kOutColumnBlockBytes / row_bytes) / NR * NR;
  RowsOutColumnBlocks<WT>(g, block_cols > NR ? block_cols : NR);
}

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

const MatmulKernels& X86Kernels() {
  static constexpr MatmulKernels kKernels = {
      &ByDtype<RowsOut<DType::kF32>, RowsOut<DType::kBF16>, RowsOut<DType::kF16>>,
      &ByDtype<RowsIn<DType::kF32>, RowsIn<DType::kBF16>, RowsIn<DType::kF16>>,
      8 * Tiles::kOneRowShortInVectors,  // ChainFewRows: one pass where vectors <= NV
  };
  return kKernels;
}

}  // namespace
}  // namespace switchserve::cpu
