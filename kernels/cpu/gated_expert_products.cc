#include "kernels/cpu/gated_expert_products.h"

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"

namespace switchserve::cpu {
namespace {

// Tasks averaging at most this many rows (a decode step's share of each
// expert) compute their products whole and then add them: their weights
// come from memory, which MatmulRunner's pieces (a whole expert's columns
// each) stream better than column blocks of every expert. Measured
// (matmul_bench BM_GatedExpertOutputs, bf16, 12 interleaved repetitions,
// fastest, first quartile and median): by blocks, 1 and 32 tokens took
// 1.03-1.35x as long; 512 tokens of the output experts 0.83-0.90x.
constexpr int kFewRows = 32;
// Columns of a kRowsOut block are a multiple of this (kRowsIn blocks take
// MatmulRunner's kRowsInColumnStep). Any multiple gives the same bits.
constexpr int kRowsOutBlockStep = 8;
// Destination bytes of one block ([tokens, columns]): they stay in the L2
// cache with the block's product while every task adds to them. Blocks
// narrow down to one column step before the tokens are split, since each
// token block reads every expert's weights again.
constexpr int64_t kDstBlockBytes = 128 << 10;

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

GatedExpertProducts::GatedExpertProducts(MatmulRunner* runner, WorkerPool* pool)
    : runner_(runner), pool_(pool), scratch_(runner->threads()) {}

void GatedExpertProducts::Run(const std::vector<GatedExpertTask>& tasks, int n, int tokens,
                              float* dst, int64_t dst_stride) {
  if (tasks.empty() || n <= 0 || tokens <= 0) return;
  int64_t macs = 0;
  int64_t rows = 0;
  bool rows_in = false;
  for (const GatedExpertTask& task : tasks) {
    const MatmulArgs& g = task.product.args;
    macs += static_cast<int64_t>(g.m) * n * g.k;
    rows += g.m;
    rows_in = rows_in || task.product.layout == WeightLayout::kRowsIn;
  }
  if (rows <= kFewRows * static_cast<int64_t>(tasks.size())) {
    return RunWhole(tasks, n, tokens, rows, dst, dst_stride);
  }
  const int threads = runner_->threads();
  const bool parallel = threads > 1 && macs >= runner_->parallel_min_macs();
  const int workers = parallel ? threads : 1;
  const int step = rows_in ? kRowsInColumnStep : kRowsOutBlockStep;
  const auto round_up = [step](int64_t c) { return CeilDiv(c, step) * step; };
  int cols = round_up(CeilDiv(n, kPiecesPerThread * workers));
  while (cols > step && static_cast<int64_t>(tokens) * cols * sizeof(float) > kDstBlockBytes) {
    cols = round_up(cols / 2);
  }
  cols = std::min(cols, n);
  const int col_blocks = CeilDiv(n, cols);
  const int64_t block_tokens =
      std::max<int64_t>(1, kDstBlockBytes / (static_cast<int64_t>(cols) * sizeof(float)));
  const int token_blocks = CeilDiv(tokens, block_tokens);
  const int per_block = CeilDiv(tokens, token_blocks);
  const auto piece = [&](int i, int slot) {
    const int t0 = i / col_blocks * per_block;
    const int j0 = i % col_blocks * cols;
    RunBlock(tasks, t0, std::min(tokens, t0 + per_block), j0, std::min(cols, n - j0), tokens, dst,
             dst_stride, scratch_[slot]);
  };
  const int pieces = col_blocks * token_blocks;
  if (!parallel) {
    for (int i = 0; i < pieces; ++i) piece(i, 0);
  } else {
    pool_->Run(pieces, piece);
  }
}

void GatedExpertProducts::RunWhole(const std::vector<GatedExpertTask>& tasks, int n, int tokens,
                                   int64_t rows, float* dst, int64_t dst_stride) {
  if (product_.size() < static_cast<size_t>(rows) * n) product_.resize(rows * n);
  whole_.clear();
  outputs_.clear();
  int64_t base = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const ExpertAssignments& as = *tasks[i].assignments;
    // A new group where the assignments change or the expert index does not
    // increase (the next head of a shared router); each group's slots are
    // [0, offsets.back()), in its own stretch of product_.
    if (i == 0 || tasks[i - 1].assignments != &as || tasks[i - 1].expert >= tasks[i].expert) {
      if (i > 0) base += tasks[i - 1].assignments->offsets.back();
      outputs_.push_back({&as, product_.data() + base * n, dst, dst_stride});
    }
    MatmulTask whole = tasks[i].product;
    whole.args.c = product_.data() + (base + as.begin(tasks[i].expert)) * n;
    whole.args.ldc = n;
    whole.args.accumulate = false;
    whole_.push_back(whole);
  }
  runner_->Run(whole_);
  AddExpertOutputs(outputs_, n, tokens, pool_, runner_->parallel_min_macs());
}

void GatedExpertProducts::RunBlock(const std::vector<GatedExpertTask>& tasks, int t0, int t1,
                                   int j0, int cols, int tokens, float* dst, int64_t dst_stride,
                                   Scratch& scratch) const {
  const bool all_tokens = t0 == 0 && t1 == tokens;
  for (const GatedExpertTask& task : tasks) {
    const ExpertAssignments& as = *task.assignments;
    const int begin = as.begin(task.expert);
    MatmulArgs args = task.product.args;
    const int32_t* slot_tokens = as.token.data() + begin;
    const float* weights = as.weight.data() + begin;
    if (!all_tokens) {
      // This block's tokens' slots: the rows of a they read, their tokens
      // and gates.
      scratch.rows.clear();
      scratch.tokens.clear();
      scratch.weights.clear();
      for (int i = 0; i < args.m; ++i) {
        const int t = as.token[begin + i];
        if (t < t0 || t >= t1) continue;
        scratch.rows.push_back(args.a_rows != nullptr ? args.a_rows[i] : i);
        scratch.tokens.push_back(t);
        scratch.weights.push_back(as.weight[begin + i]);
      }
      args.m = static_cast<int>(scratch.rows.size());
      args.a_rows = scratch.rows.data();
      slot_tokens = scratch.tokens.data();
      weights = scratch.weights.data();
    }
    if (args.m == 0) continue;
    const bool rows_out = task.product.layout == WeightLayout::kRowsOut;
    args.n = cols;
    args.w = rows_out ? args.w.At(j0, 0) : args.w.At(0, j0);
    // Added to the tokens' rows by the kernel (from its tiles' registers
    // where it can).
    args.c = dst + j0;
    args.ldc = dst_stride;
    args.c_rows = slot_tokens;
    args.c_scale = weights;
    (rows_out ? runner_->kernels().rows_out : runner_->kernels().rows_in)(args);
  }
}

}  // namespace switchserve::cpu
