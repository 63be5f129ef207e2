// Causal attention of a step's queries over the paged KV cache, with one
// operation order per (query, head) whatever the step holds: a decode token,
// a prefill chunk of any length, or the same token in a different chunk or
// batch gets the same bits. For the query at position p of a sequence and
// head h (KV head g):
//
//   s_j  = dot8(q, k_j) for every key j <= p              (matmul.h, rows out)
//          [XL positions: s_j = s_j + dot8(q, R_h[p - j]), cpu_xl_positions.h]
//   m    = max_j s_j;  e_j = exp(s_j - m);  sum = e_0 + e_1 + ... + e_p   (in j order)
//   a    = (chain over j in KV-block order of e_j * v_j)   (matmul.h, rows in)
//          * (1 / sum)
//
// With destination value routing (Ev = E values cached per KV head) the
// query's kept value gates w_e weight the experts' chains:
//   a = sum over e with w_e != 0, ascending, of (w_e * (1 / sum)) * chain_e.
//
// A chunk's queries attend in tiles of consecutive positions: all rows of a
// tile that see a whole KV block reduce it in one product; the rows whose
// causal horizon ends inside a block reduce their visible part alone (a
// rows-in chain over p ranges gives the same bits as one call over their
// union). Work is shared out over (sequence, query tile, head); with enough
// tiles, each tile's heads stay together, reading each KV block once for all
// of them. With too few tiles for that, a decode tile over a long context
// first has its scores computed for all heads, its KV blocks shared out in
// ranges (each key's score is its own dot8: the same bits), reading the keys
// whole and in address order and touching the values likewise; its heads'
// pieces then take the scores from there.
//
// Not thread-safe: owns per-thread scratch, reused across calls.
#ifndef SWITCHSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
#define SWITCHSERVE_KERNELS_CPU_PAGED_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/runtime/step_batch.h"
#include "kernels/cpu/cpu_xl_positions.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {

// One layer's KV cache: keys [rows, G, dh] and values [rows, G * Ev, dh], in
// f32 or bf16 (CpuBackendOptions::kv_cache_dtype); the products widen bf16
// keys and values in registers, as they do bf16 weights.
struct KvLayerCache {
  DType dtype = DType::kF32;
  void* k = nullptr;
  void* v = nullptr;
};

class PagedAttention {
 public:
  // `pool` must outlive this. Steps whose attention needs fewer multiply-adds
  // than `parallel_min_macs` run on the calling thread.
  PagedAttention(const AttentionConfig& attention, KernelIsa isa, WorkerPool* pool,
                 int64_t parallel_min_macs);

  // a[t, h, :] for every token t of `step` and query head h, from q [T, H, dh]
  // (scaled and rotated) and one layer's `cache` (the step's keys and values
  // already written). `positions`:
  // the layer's XL position keys (empty with RoPE). `value_gates` [T, G, Ev]:
  // the destination routing's kept gates (null unless Ev > 1).
  void Run(const StepBatch& step, const float* q, const KvLayerCache& cache,
           const XlPositionKeys& positions, const float* value_gates, float* a);

 private:
  struct Piece {
    int sequence;
    int head;   // the first query head
    int heads;  // query heads [head, head + heads)
    int first;  // first token of the tile (step order)
    int rows;   // tokens in the tile
    // Where the tile's scores were computed beforehand ([H, rows, keys] in
    // split_scores_), or -1: the piece computes its own.
    int64_t scores_at = -1;
  };
  // Scores of a tile's KV blocks [block_begin, block_end), for all heads.
  struct ScorePiece {
    Piece tile;  // all heads
    int block_begin, block_end;
  };
  struct Scratch {
    std::vector<float> scores;  // [heads, tile rows, keys]: s, then e
    std::vector<float> sums;    // [heads, tile rows]
    std::vector<float> chain;   // [tile rows, heads, dh]: one expert's chains (Ev > 1)
  };
  // The KV head query head `head` reads.
  int KvHead(int head) const { return head / (heads_ / kv_heads_); }
  // The layer's keys [rows, G * dh] and values [rows, G * Ev * dh] as the
  // products read them.
  WeightMatrix KeyCache(const KvLayerCache& cache) const {
    return {cache.dtype, cache.k, static_cast<int64_t>(kv_heads_) * head_dim_};
  }
  WeightMatrix ValueCache(const KvLayerCache& cache) const {
    return {cache.dtype, cache.v,
            static_cast<int64_t>(kv_heads_) * values_per_kv_head_ * head_dim_};
  }
  // Whether `piece` reads each KV block's rows once in address order before
  // its heads read them (a decode tile whose heads cover every KV head).
  bool TouchesBlocks(const Piece& piece) const;
  // The keys the tile's last row sees, and the KV blocks that hold them.
  static int Keys(const StepBatch& step, const Piece& piece) {
    return step.positions[piece.first] + piece.rows;
  }
  static int KeyBlocks(const StepBatch& step, const Piece& piece) {
    return (Keys(step, piece) + step.block_size - 1) / step.block_size;
  }
  // s_j = dot8(q, k_j) for the piece's heads and tile rows and the keys of
  // its sequence's KV blocks [block_begin, block_end), block by block, for
  // the rows that see any key of a block (keys past a row's horizon are
  // computed and never read). Head hh's row r at scores + (hh * rows + r) *
  // keys.
  void Scores(const StepBatch& step, const Piece& piece, int block_begin, int block_end,
              const float* q, const KvLayerCache& cache, float* scores) const;
  // Reads the values of the piece's sequence's KV blocks [block_begin,
  // block_end) in address order (TouchInOrder).
  void TouchValues(const StepBatch& step, const Piece& piece, int block_begin, int block_end,
                   const KvLayerCache& cache) const;
  // `split_scores`: split_scores_'s data (the piece's scores where
  // scores_at >= 0).
  void AttendTile(const StepBatch& step, const Piece& piece, const float* q,
                  const KvLayerCache& cache, const XlPositionKeys& positions,
                  const float* value_gates, float* a, float* split_scores, Scratch& scratch) const;
  // out[r] (+)= sum over keys of e[r][j] * v_j (cached value `expert` of the
  // head's KV head) for each of the piece's heads and tile rows, block by
  // block and head by head within a block, each row over its visible keys
  // only. e: [heads, rows, lde]; head hh's rows at out + hh * out_head_stride.
  void ReduceValues(const StepBatch& step, const Piece& piece, const float* e, int64_t lde,
                    const KvLayerCache& cache, int expert, float* out, int64_t ldo,
                    int64_t out_head_stride) const;

  int heads_, kv_heads_, head_dim_, values_per_kv_head_;
  const MatmulKernels* kernels_;
  WorkerPool* pool_;
  int64_t parallel_min_macs_;
  std::vector<Piece> pieces_;
  std::vector<Piece> split_tiles_;  // the tiles whose scores come first
  std::vector<ScorePiece> score_pieces_;
  std::vector<float> split_scores_;
  std::vector<Scratch> scratch_;  // per pool slot
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
