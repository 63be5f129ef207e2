#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/target_clones.h"
#include "kernels/cpu/vector_math.h"

namespace switchserve::cpu {
namespace {

// Query rows per tile: a tile's scores ([tile, keys] floats) stay in L2.
constexpr int kQueryTile = 64;
// A tile takes all its heads in one piece, KV block by KV block (each block's
// rows read once for every head, in storage order), where there are at least
// kPiecesPerThread tiles per thread and the heads' scores take at most
// kAllHeadsScoreBytes; else one head per piece.
constexpr int64_t kAllHeadsScoreBytes = 128 << 10;
// Tiles of at most this many rows (decode) read each KV block whole, in
// address order, before their heads read it (TouchInOrder), where the block's
// rows are all theirs; more rows compute long enough on each block to hide
// its strided reads.
constexpr int kTouchMaxRows = 8;
// With too few tiles to keep each tile's heads together, a decode tile (at
// most kTouchMaxRows rows) that sees at least this many keys has its scores
// computed first for all heads, its KV blocks shared out in ranges of at
// least kMinScoreBlocks: each piece reads the keys whole, in address order,
// and touches the values of its blocks in order (TouchInOrder), instead of
// each head's piece reading its part of every row from memory. Batch 1 at a
// 2000-token context on a 2-vCPU Zen 4 VM (engine_bench --pool-timeline,
// five alternated rounds): 163-228 us of attention a layer against
// 240-288, lower in every round; 512 keys is a judgement.
constexpr int kSplitScoresMinKeys = 512;
constexpr int kMinScoreBlocks = 4;

template <typename T>
void Grow(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
}

// Sixteen floats, for the lane maxima below: GCC vectorizes a loop over an
// array with a conditional only sometimes; a vector type always (two zmm
// or four ymm chains of 32 elements).
typedef float Lanes16 __attribute__((vector_size(64)));

// Row r of `rows` rows (stride lds) holds first_n + r visible scores. Each
// row in place: e_j = exp(s_j - max) over its visible scores, and sums[r]
// their sum in key order. The maximum is taken 32 lanes at a time: the same
// value in any order, but for the sign of a zero maximum, which no e_j
// depends on (s - 0 and s - (-0) are equal, or zeros that Exp takes to 1).
// Eight rows' sums are added side by side, eight independent chains instead
// of one whose every addition waits for the last; each row's is still e_0 +
// e_1 + ... in order. Built for AVX-512 and AVX2 too, picked at load time
// where the CPU has them: the same IEEE operations per element at any width
// (vector_math.h), so the same bits.
SWITCHSERVE_TARGET_CLONES("avx512f", "avx2", "default")
void ExpRows(float* scores, int64_t lds, int rows, int first_n, float* sums) {
  for (int r = 0; r < rows; ++r) {
    float* e = scores + r * lds;
    const int n = first_n + r;
    constexpr float kLow = -INFINITY;
    Lanes16 lane_max[2] = {{kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow,
                            kLow, kLow, kLow, kLow},
                           {kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow,
                            kLow, kLow, kLow, kLow}};
    int j = 0;
    for (; j + 32 <= n; j += 32) {
      for (int h = 0; h < 2; ++h) {
        Lanes16 v;
        std::memcpy(&v, e + j + 16 * h, sizeof(v));
        lane_max[h] = v > lane_max[h] ? v : lane_max[h];
      }
    }
    float smax = -INFINITY;
    for (; j < n; ++j) smax = e[j] > smax ? e[j] : smax;
    for (const Lanes16& m : lane_max) {
      for (int l = 0; l < 16; ++l) smax = m[l] > smax ? m[l] : smax;
    }
    for (j = 0; j < n; ++j) e[j] = Exp(e[j] - smax);
  }
  int r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) {
    const float* e = scores + r0 * lds;
    float s[8] = {};
    // All eight rows see the first row's keys.
    const int common = first_n + r0;
    for (int j = 0; j < common; ++j) {
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) s[i] += e[i * lds + j];
    }
    for (int i = 0; i < 8; ++i) {
      for (int j = common; j < common + i; ++j) s[i] += e[i * lds + j];
      sums[r0 + i] = s[i];
    }
  }
  for (; r0 < rows; ++r0) {
    const float* e = scores + r0 * lds;
    float sum = 0.0f;
    for (int j = 0; j < first_n + r0; ++j) sum += e[j];
    sums[r0] = sum;
  }
}

// Reads one byte of every cache line of rows [row, row + rows) of a
// row-major cache, in address order. A tile reads a KV block a head at a time: a short piece of
// every row, a strided pattern that the hardware prefetcher follows from memory at about 60% of the
// streaming rate. Touching the block in order first brings it in at the streaming rate, and the
// heads then read it from the cache. Software prefetches of the same lines did not (a probe on an
// AMD EPYC (Zen 4) VM, two threads, 32 sequences of 8 blocks of 16 rows of 896 bytes: head by head
// 19-21 GB/s, touched first 29-34, prefetched into L2 first 20-24, read whole in order 33-36).
// Changes no arithmetic.
void TouchInOrder(const WeightMatrix& cache, int64_t row, int rows) {
  const char* first = static_cast<const char*>(cache.At(row, 0).data);
  const char* last = first + rows * cache.ld * DTypeSize(cache.dtype) - 1;
  unsigned char sum = 0;
  // first, then a line on, ..., and the last byte: every line, no byte
  // outside the range.
  for (const char* p = first; p < last; p += 64) {
    sum += *reinterpret_cast<const volatile unsigned char*>(p);
  }
  sum += *reinterpret_cast<const volatile unsigned char*>(last);
  asm volatile("" : : "r"(sum));
}

}  // namespace

PagedAttention::PagedAttention(const AttentionConfig& attention, KernelIsa isa, WorkerPool* pool,
                               int64_t parallel_min_macs)
    : heads_(attention.n_heads),
      kv_heads_(attention.n_kv_heads),
      head_dim_(attention.head_dim),
      values_per_kv_head_(attention.CachedValuesPerKvHead()),
      kernels_(&KernelsFor(isa)),
      pool_(pool),
      parallel_min_macs_(parallel_min_macs),
      scratch_(pool->threads()) {}

void PagedAttention::Run(const StepBatch& step, const float* q, const KvLayerCache& cache,
                         const XlPositionKeys& positions, const float* value_gates, float* a) {
  pieces_.clear();
  int64_t macs = 0;
  int tiles = 0;
  for (int s = 0; s < step.num_sequences(); ++s) {
    const int n = step.num_tokens(s);
    if (n == 0) continue;
    const int64_t keys = static_cast<int64_t>(step.positions[step.token_offsets[s]]) + n;
    macs += keys * n * heads_ * head_dim_ * (1 + values_per_kv_head_ + (positions ? 1 : 0));
    tiles += (n + kQueryTile - 1) / kQueryTile;
  }
  // Enough tiles to share out keep each tile's heads together where their
  // scores fit kAllHeadsScoreBytes.
  const int threads = pool_->threads();
  const bool many_tiles = tiles >= kPiecesPerThread * threads;
  const bool parallel = threads > 1 && macs >= parallel_min_macs_;
  split_tiles_.clear();
  int64_t split_floats = 0;
  int split_blocks = 0;
  for (int s = 0; s < step.num_sequences(); ++s) {
    const int first = step.token_offsets[s];
    const int n = step.num_tokens(s);
    for (int i0 = 0; i0 < n; i0 += kQueryTile) {
      const int rows = std::min(kQueryTile, n - i0);
      const int64_t keys = static_cast<int64_t>(step.positions[first + i0]) + rows;
      const int64_t all_heads_bytes = keys * rows * heads_ * static_cast<int64_t>(sizeof(float));
      const int heads = many_tiles && all_heads_bytes <= kAllHeadsScoreBytes ? heads_ : 1;
      Piece tile{s, 0, heads_, first + i0, rows};
      if (parallel && !many_tiles && rows <= kTouchMaxRows && keys >= kSplitScoresMinKeys) {
        tile.scores_at = split_floats;
        split_floats += heads_ * rows * keys;
        split_blocks += KeyBlocks(step, tile);
        split_tiles_.push_back(tile);
      }
      for (int h = 0; h < heads_; h += heads) {
        Piece piece = tile;
        piece.head = h;
        piece.heads = heads;
        pieces_.push_back(piece);
      }
    }
  }
  if (!split_tiles_.empty()) {
    // The split tiles' scores: their blocks in ranges, kPiecesPerThread a
    // thread in all.
    const int wanted = kPiecesPerThread * threads;
    const int per_piece = std::max(kMinScoreBlocks, (split_blocks + wanted - 1) / wanted);
    score_pieces_.clear();
    for (const Piece& tile : split_tiles_) {
      const int blocks = KeyBlocks(step, tile);
      for (int b = 0; b < blocks; b += per_piece) {
        score_pieces_.push_back({tile, b, std::min(blocks, b + per_piece)});
      }
    }
    Grow(split_scores_, static_cast<size_t>(split_floats));
    pool_->Run(static_cast<int>(score_pieces_.size()), [&](int i, int) {
      const ScorePiece& sp = score_pieces_[i];
      Scores(step, sp.tile, sp.block_begin, sp.block_end, q, cache,
             split_scores_.data() + sp.tile.scores_at);
      // Their values too: the heads' pieces then read them from the cache.
      if (values_per_kv_head_ == 1) TouchValues(step, sp.tile, sp.block_begin, sp.block_end, cache);
    });
  }
  const auto attend = [&](int i, int slot) {
    AttendTile(step, pieces_[i], q, cache, positions, value_gates, a, split_scores_.data(),
               scratch_[slot]);
  };
  if (!parallel) {
    for (int i = 0; i < static_cast<int>(pieces_.size()); ++i) attend(i, 0);
  } else {
    pool_->Run(static_cast<int>(pieces_.size()), attend);
  }
}

void PagedAttention::Scores(const StepBatch& step, const Piece& piece, int block_begin,
                            int block_end, const float* q, const KvLayerCache& cache,
                            float* scores) const {
  const int H = heads_, dh = head_dim_;
  const int rows = piece.rows;
  const int start = step.positions[piece.first];
  const int keys = Keys(step, piece);
  const int64_t lds = keys, head_scores = static_cast<int64_t>(rows) * lds;
  const int bs = step.block_size;
  const int32_t* table = step.block_table(piece.sequence);
  const WeightMatrix k_cache = KeyCache(cache);
  const bool touch = TouchesBlocks(piece);
  const int end = std::min(keys, block_end * bs);
  for (int b0 = block_begin * bs; b0 < end; b0 += bs) {
    const int r0 = std::max(0, b0 - start);
    if (touch) {
      TouchInOrder(k_cache, static_cast<int64_t>(table[b0 / bs]) * bs, std::min(bs, keys - b0));
    }
    for (int hh = 0; hh < piece.heads; ++hh) {
      MatmulArgs args{rows - r0,
                      std::min(bs, keys - b0),
                      dh,
                      q + (static_cast<int64_t>(piece.first + r0) * H + piece.head + hh) * dh,
                      static_cast<int64_t>(H) * dh,
                      nullptr,
                      k_cache.At(static_cast<int64_t>(table[b0 / bs]) * bs,
                                 static_cast<int64_t>(KvHead(piece.head + hh)) * dh),
                      scores + hh * head_scores + r0 * lds + b0,
                      lds};
      kernels_->rows_out(args);
    }
  }
}

void PagedAttention::TouchValues(const StepBatch& step, const Piece& piece, int block_begin,
                                 int block_end, const KvLayerCache& cache) const {
  const int bs = step.block_size, keys = Keys(step, piece);
  const WeightMatrix v_cache = ValueCache(cache);
  const int32_t* table = step.block_table(piece.sequence);
  for (int b = block_begin; b < block_end; ++b) {
    TouchInOrder(v_cache, static_cast<int64_t>(table[b]) * bs, std::min(bs, keys - b * bs));
  }
}

bool PagedAttention::TouchesBlocks(const Piece& piece) const {
  return piece.rows <= kTouchMaxRows && KvHead(piece.head) == 0 &&
         KvHead(piece.head + piece.heads - 1) == kv_heads_ - 1;
}

void PagedAttention::AttendTile(const StepBatch& step, const Piece& piece, const float* q,
                                const KvLayerCache& cache, const XlPositionKeys& positions,
                                const float* value_gates, float* a, float* split_scores,
                                Scratch& scratch) const {
  const int H = heads_, G = kv_heads_, dh = head_dim_, ev = values_per_kv_head_;
  const int rows = piece.rows;
  const int start = step.positions[piece.first];  // the tile's positions are start, start + 1, ...
  const int keys = Keys(step, piece);             // its last row sees keys [0, keys)
  const int64_t lds = keys;
  const int64_t head_scores = static_cast<int64_t>(rows) * lds;  // [rows, keys] per head
  Grow(scratch.sums, static_cast<size_t>(piece.heads) * rows);
  const auto q_rows = [&](int hh) {
    return q + (static_cast<int64_t>(piece.first) * H + piece.head + hh) * dh;
  };

  float* all_scores;  // the piece's heads' [rows, keys] scores, one after the other
  if (piece.scores_at >= 0) {
    all_scores = split_scores + piece.scores_at + piece.head * head_scores;
  } else {
    Grow(scratch.scores, static_cast<size_t>(piece.heads) * head_scores);
    all_scores = scratch.scores.data();
    Scores(step, piece, 0, KeyBlocks(step, piece), q, cache, all_scores);
  }
  for (int hh = 0; hh < piece.heads; ++hh) {
    float* scores = all_scores + hh * head_scores;
    if (positions) {
      // XL: s_j += dot8(q, R_h[i - j]) for the row at position i, its keys
      // j <= i: the table rows R_h[i], R_h[i - 1], ..., R_h[0], read backwards
      // (a leading dimension of -dh).
      for (int r = 0; r < rows; ++r) {
        const int i = start + r;
        MatmulArgs args{1,
                        i + 1,
                        dh,
                        q_rows(hh) + static_cast<int64_t>(r) * H * dh,
                        static_cast<int64_t>(H) * dh,
                        nullptr,
                        {DType::kF32, positions.At(piece.head + hh, i), -static_cast<int64_t>(dh)},
                        scores + r * lds,
                        lds};
        args.accumulate = true;
        kernels_->rows_out(args);
      }
    }
    // e_j = exp(s_j - max) over each row's visible keys, and their sum in key order.
    ExpRows(scores, lds, rows, start + 1, scratch.sums.data() + hh * rows);
  }

  float* out = a + (static_cast<int64_t>(piece.first) * H + piece.head) * dh;
  const int64_t ldo = static_cast<int64_t>(H) * dh;
  if (ev == 1) {
    ReduceValues(step, piece, all_scores, lds, cache, /*expert=*/0, out, ldo, dh);
    for (int hh = 0; hh < piece.heads; ++hh) {
      for (int r = 0; r < rows; ++r) {
        const float inv = 1.0f / scratch.sums[hh * rows + r];
        float* o = out + r * ldo + hh * dh;
        for (int i = 0; i < dh; ++i) o[i] *= inv;
      }
    }
    return;
  }
  // Destination value routing: each expert's chain, weighted by the query's gate.
  Grow(scratch.chain, static_cast<size_t>(piece.heads) * rows * dh);
  for (int r = 0; r < rows; ++r) std::fill(out + r * ldo, out + r * ldo + piece.heads * dh, 0.0f);
  for (int e = 0; e < ev; ++e) {
    ReduceValues(step, piece, all_scores, lds, cache, e, scratch.chain.data(), piece.heads * dh,
                 dh);
    for (int hh = 0; hh < piece.heads; ++hh) {
      const int g = KvHead(piece.head + hh);
      for (int r = 0; r < rows; ++r) {
        const float gate = value_gates[(static_cast<int64_t>(piece.first + r) * G + g) * ev + e];
        if (gate == 0.0f) continue;
        const float c = gate * (1.0f / scratch.sums[hh * rows + r]);
        const float* chain = scratch.chain.data() + r * piece.heads * dh + hh * dh;
        float* o = out + r * ldo + hh * dh;
        for (int i = 0; i < dh; ++i) o[i] = o[i] + c * chain[i];
      }
    }
  }
}

void PagedAttention::ReduceValues(const StepBatch& step, const Piece& piece, const float* e,
                                  int64_t lde, const KvLayerCache& cache, int expert, float* out,
                                  int64_t ldo, int64_t out_head_stride) const {
  const int dh = head_dim_;
  const int bs = step.block_size;
  const int rows = piece.rows;
  const int start = step.positions[piece.first];
  const int keys = Keys(step, piece);
  const int64_t head_scores = static_cast<int64_t>(rows) * lde;
  const int32_t* table = step.block_table(piece.sequence);
  const WeightMatrix v_cache = ValueCache(cache);
  // With one cached value per KV head, the piece's heads read whole rows.
  const bool touch = values_per_kv_head_ == 1 && TouchesBlocks(piece);
  for (int b0 = 0; b0 < keys; b0 += bs) {
    const int n = std::min(bs, keys - b0);
    if (touch) {
      TouchInOrder(v_cache, static_cast<int64_t>(table[b0 / bs]) * bs, n);
    }
    // Row r sees keys [0, start + r]: all of this block from r_full on.
    const int r_first = std::max(0, b0 - start);
    const int r_full = std::min(rows, std::max(0, b0 + n - 1 - start));
    for (int hh = 0; hh < piece.heads; ++hh) {
      const int g = KvHead(piece.head + hh);
      const WeightMatrix values =
          v_cache.At(static_cast<int64_t>(table[b0 / bs]) * bs,
                     static_cast<int64_t>(g * values_per_kv_head_ + expert) * dh);
      const float* eh = e + hh * head_scores;
      float* oh = out + hh * out_head_stride;
      for (int r = r_first; r < r_full; ++r) {  // horizons inside the block: alone
        MatmulArgs args{
            1, dh, start + r - b0 + 1, eh + r * lde + b0, lde, nullptr, values, oh + r * ldo, ldo};
        args.accumulate = b0 > 0;
        kernels_->rows_in(args);
      }
      if (r_full < rows) {
        MatmulArgs args{rows - r_full,     dh, n, eh + r_full * lde + b0, lde, nullptr, values,
                        oh + r_full * ldo, ldo};
        args.accumulate = b0 > 0;
        kernels_->rows_in(args);
      }
    }
  }
}

}  // namespace switchserve::cpu
