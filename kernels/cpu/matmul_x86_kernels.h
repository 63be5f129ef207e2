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
// compiles its own copy. Below the helpers every part shares, the kernels
// come in four parts: matmul_x86_dot_tiles.h (8-lane MatmulRowsOut tiles),
// matmul_x86_pair_tiles.h (16-lane ones), matmul_x86_rows_out.h (MatmulRowsOut)
// and matmul_x86_rows_in.h (MatmulRowsIn).
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

}  // namespace
}  // namespace switchserve::cpu

// The parts, in this order: each uses the ones before it.
// clang-format off
#include "kernels/cpu/matmul_x86_dot_tiles.h"
#include "kernels/cpu/matmul_x86_pair_tiles.h"
#include "kernels/cpu/matmul_x86_rows_out.h"
#include "kernels/cpu/matmul_x86_rows_in.h"
// clang-format on

namespace switchserve::cpu {
namespace {

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
