#include "kernels/cpu/matmul_runner.h"

#include <algorithm>
#include <numeric>

#include "kernels/cpu/cpu_ops.h"

namespace switchserve::cpu {
namespace {

// Piece boundaries fall on multiples of these columns (whole register tiles:
// three weight rows for kRowsOut, kRowsInColumnStep for kRowsIn; for kRowsIn,
// 1 KiB of weights where the matrix is wide enough) and rows.
constexpr int kRowsOutColumnStep = 24;
constexpr int kRowStep = 64;
constexpr int64_t kMinPieceMacs = 1 << 15;
// RunPairs takes a pair whole where its products average at most this many
// rows (GatedExpertProducts' line between decode and prefill).
constexpr int kPairFewRows = 32;

int64_t Macs(const MatmulArgs& args) { return static_cast<int64_t>(args.m) * args.n * args.k; }

// `order` = 0 .. count - 1 by decreasing macs(i), ties in index order: the
// order the pool hands pieces out in, so that the last ones taken, which
// decide how long one thread waits for the other at the end of a job, are
// the smallest (the experts of a decode step differ in rows).
template <typename MacsOf>
void LargestFirst(int count, const MacsOf& macs, std::vector<int>* order) {
  order->resize(count);
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(), [&](int a, int b) { return macs(a) > macs(b); });
}

void RunOne(const MatmulKernels& kernels, const MatmulTask& task) {
  const MatmulArgs& g = task.args;
  (task.layout == WeightLayout::kRowsOut ? kernels.rows_out : kernels.rows_in)(g);
  const MatmulEpilogue& e = task.epilogue;
  AddBiasRows(g.c, g.m, g.n, static_cast<int>(g.ldc), e.bias);
  if (!e.activation.has_value()) return;
  if (g.ldc == g.n) {  // whole rows, one after another: one call (fewer vector tails)
    ApplyActivation(*e.activation, g.c, static_cast<int64_t>(g.m) * g.n);
    return;
  }
  for (int i = 0; i < g.m; ++i) ApplyActivation(*e.activation, g.c + i * g.ldc, g.n);
}

}  // namespace

MatmulRunner::MatmulRunner(KernelIsa isa, WorkerPool* pool, int64_t parallel_min_macs)
    : kernels_(&KernelsFor(isa)), pool_(pool), parallel_min_macs_(parallel_min_macs) {}

void MatmulRunner::Run(WeightLayout layout, const MatmulArgs& args,
                       const MatmulEpilogue& epilogue) {
  single_.resize(1);
  single_[0] = {layout, args, epilogue};
  Run(single_);
}

void MatmulRunner::Run(const std::vector<MatmulTask>& tasks) {
  int64_t macs = 0;
  for (const MatmulTask& task : tasks) macs += Macs(task.args);
  const int threads = this->threads();
  if (threads == 1 || macs < parallel_min_macs_) {
    for (const MatmulTask& task : tasks) RunOne(*kernels_, task);
    return;
  }
  pieces_.clear();
  const int64_t target = std::max(kMinPieceMacs, macs / (kPiecesPerThread * threads));
  for (const MatmulTask& task : tasks) {
    if (task.args.m <= 0 || task.args.n <= 0) continue;
    const MatmulArgs& g = task.args;
    int step = task.layout == WeightLayout::kRowsOut ? kRowsOutColumnStep : kRowsInColumnStep;
    if (task.layout == WeightLayout::kRowsIn) {
      // Pieces whose rows stream in order (kRowsInLongRowBytes), where there
      // are enough of them for every thread.
      const int long_columns = static_cast<int>(kRowsInLongRowBytes / DTypeSize(g.w.dtype));
      if (g.n >= long_columns * threads) step = std::max(step, long_columns);
    }
    const int row_step = g.m > kRowStep ? kRowStep : g.m;
    // Columns per piece: enough for `target` multiply-adds over row_step rows.
    const int64_t per_column = static_cast<int64_t>(row_step) * std::max(1, g.k);
    int64_t columns = (target + per_column - 1) / per_column;
    columns = (columns + step - 1) / step * step;
    const int width = static_cast<int>(std::min<int64_t>(columns, g.n));
    for (int i0 = 0; i0 < g.m; i0 += row_step) {
      for (int j0 = 0; j0 < g.n; j0 += width) {
        MatmulTask piece = task;
        MatmulArgs& p = piece.args;
        p.m = std::min(row_step, g.m - i0);
        p.n = std::min(width, g.n - j0);
        if (g.a_rows != nullptr) {
          p.a_rows = g.a_rows + i0;
        } else {
          p.a = g.a + i0 * g.lda;
        }
        p.c = g.c + i0 * g.ldc + j0;
        p.w = task.layout == WeightLayout::kRowsOut ? g.w.At(j0, 0) : g.w.At(0, j0);
        if (task.epilogue.bias != nullptr) piece.epilogue.bias = task.epilogue.bias + j0;
        pieces_.push_back(piece);
      }
    }
  }
  const int count = static_cast<int>(pieces_.size());
  LargestFirst(
      count, [this](int i) { return Macs(pieces_[i].args); }, &order_);
  pool_->Run(count, [this](int i, int) { RunOne(*kernels_, pieces_[order_[i]]); });
}

void MatmulRunner::RunPairs(const std::vector<MatmulTask>& first,
                            const std::vector<MatmulTask>& second) {
  const int threads = this->threads();
  const int pairs = static_cast<int>(first.size());
  int64_t macs = 0, rows = 0;
  for (int i = 0; i < pairs; ++i) {
    macs += Macs(first[i].args) + Macs(second[i].args);
    rows += first[i].args.m + second[i].args.m;
  }
  if (threads == 1 || pairs < 2 * threads || macs < parallel_min_macs_ ||
      rows > int64_t{2} * kPairFewRows * pairs) {
    Run(first);
    Run(second);
    return;
  }
  LargestFirst(
      pairs, [&](int i) { return Macs(first[i].args) + Macs(second[i].args); }, &order_);
  pool_->Run(pairs, [&](int i, int) {
    RunOne(*kernels_, first[order_[i]]);
    RunOne(*kernels_, second[order_[i]]);
  });
}

}  // namespace switchserve::cpu
