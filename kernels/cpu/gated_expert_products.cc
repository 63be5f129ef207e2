#include "kernels/cpu/gated_expert_products.h"

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"

namespace switchserve::cpu {
namespace {

// Columns of a block: whole vectors of eight (kRowsIn in MatmulRunner's
// steps of 64; a kRowsOut block takes any number of weight rows).
constexpr int kRowsOutColumnStep = 8;
constexpr int kRowsInColumnStep = 64;
// Tasks averaging at most this many rows (a decode step's share of each
// expert) stream their weights from memory: a rows-in block then spans
// kRowsInLongRowBytes of each weight row where the matrix is wide enough,
// as MatmulRunner's pieces do.
constexpr int kFewRows = 32;
// Destination bytes of one block ([tokens, columns]): they stay in the L2
// cache with the block's product while every task adds to them. Blocks
// narrow down to one column step before the tokens are split, since each
// token block reads every expert's weights again.
constexpr int64_t kDstBlockBytes = 128 << 10;

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

GatedExpertProducts::GatedExpertProducts(const MatmulRunner* runner, WorkerPool* pool)
    : runner_(runner), pool_(pool), scratch_(runner->threads()) {}

void GatedExpertProducts::Run(const std::vector<GatedExpertTask>& tasks, int n, int tokens,
                              float* dst, int64_t dst_stride) {
  if (tasks.empty() || n <= 0 || tokens <= 0) return;
  int64_t macs = 0;
  int64_t rows = 0;
  bool rows_in = false;
  int64_t element_bytes = 4;
  for (const GatedExpertTask& task : tasks) {
    const MatmulArgs& g = task.product.args;
    macs += static_cast<int64_t>(g.m) * n * g.k;
    rows += g.m;
    if (task.product.layout == WeightLayout::kRowsIn) {
      rows_in = true;
      element_bytes = std::min<int64_t>(element_bytes, DTypeSize(g.w.dtype));
    }
  }
  const int threads = runner_->threads();
  const bool parallel = threads > 1 && macs >= runner_->parallel_min_macs();
  const int workers = parallel ? threads : 1;
  int step = rows_in ? kRowsInColumnStep : kRowsOutColumnStep;
  const int long_columns = static_cast<int>(kRowsInLongRowBytes / element_bytes);
  if (rows_in && rows <= kFewRows * static_cast<int64_t>(tasks.size()) &&
      n >= long_columns * workers) {
    step = std::max(step, long_columns);
  }
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

void GatedExpertProducts::RunBlock(const std::vector<GatedExpertTask>& tasks, int t0, int t1,
                                   int j0, int cols, int tokens, float* dst, int64_t dst_stride,
                                   Scratch& scratch) const {
  const bool all_tokens = t0 == 0 && t1 == tokens;
  for (const GatedExpertTask& task : tasks) {
    const ExpertAssignments& as = *task.assignments;
    const int begin = as.begin(task.expert);
    MatmulArgs args = task.product.args;
    if (!all_tokens) {
      // This block's tokens' slots, and the rows of a they read.
      scratch.rows.clear();
      scratch.slots.clear();
      for (int i = 0; i < args.m; ++i) {
        const int t = as.token[begin + i];
        if (t < t0 || t >= t1) continue;
        scratch.rows.push_back(args.a_rows != nullptr ? args.a_rows[i] : i);
        scratch.slots.push_back(begin + i);
      }
      args.m = static_cast<int>(scratch.rows.size());
      args.a_rows = scratch.rows.data();
    }
    if (args.m == 0) continue;
    const bool rows_out = task.product.layout == WeightLayout::kRowsOut;
    args.n = cols;
    args.w = rows_out ? args.w.At(j0, 0) : args.w.At(0, j0);
    if (scratch.product.size() < static_cast<size_t>(args.m) * cols) {
      scratch.product.resize(static_cast<size_t>(args.m) * cols);
    }
    args.c = scratch.product.data();
    args.ldc = cols;
    args.accumulate = false;
    (rows_out ? runner_->kernels().rows_out : runner_->kernels().rows_in)(args);
    for (int r = 0; r < args.m; ++r) {
      const int s = all_tokens ? begin + r : scratch.slots[r];
      float* product = scratch.product.data() + static_cast<int64_t>(r) * cols;
      if (task.bias != nullptr) AddBiasRows(product, 1, cols, cols, task.bias + j0);
      AddScaledRow(dst + as.token[s] * dst_stride + j0, product, as.weight[s], cols);
    }
  }
}

}  // namespace switchserve::cpu
