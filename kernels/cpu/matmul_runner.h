// Runs a group of matrix products (matmul.h) on the backend's threads: every
// product of the group is cut into pieces of output rows and columns, and the
// pieces of all of them are shared out in one parallel region, so that a
// module's many small products (one per active expert) keep every core busy
// without one region per product. Work is never split over k, so no element's
// operations depend on the thread count or on the other products.
//
// Not thread-safe: owns the list of pieces, reused across calls.
#ifndef SWITCHSERVE_KERNELS_CPU_MATMUL_RUNNER_H_
#define SWITCHSERVE_KERNELS_CPU_MATMUL_RUNNER_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/model/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {

// Which product of matmul.h: the weight matrix's rows are outputs ([n, k],
// nn.Linear) or inputs ([k, n]).
enum class WeightLayout { kRowsOut, kRowsIn };

// Rows-in pieces start on multiples of these columns: eight vectors of
// eight.
inline constexpr int kRowsInColumnStep = 64;

// What happens to each output element once the product is in c: c += bias
// (one add; `bias` holds the n columns' values, null: none), then the
// activation. Each piece applies it to its own block of c right after
// computing it, so the result is the same bits as AddBiasRows and
// ApplyActivation over the whole output afterwards (both are elementwise), and
// the work is shared out with the product instead of running alone after it.
struct MatmulEpilogue {
  const float* bias = nullptr;
  std::optional<Activation> activation = std::nullopt;
};

struct MatmulTask {
  WeightLayout layout = WeightLayout::kRowsOut;
  MatmulArgs args;
  MatmulEpilogue epilogue = {};
};

class MatmulRunner {
 public:
  // `pool` (null: the calling thread alone) must outlive the runner.
  // `parallel_min_macs`: a group with fewer multiply-adds runs on the calling
  // thread (sharing it out costs more than it saves).
  MatmulRunner(KernelIsa isa, WorkerPool* pool, int64_t parallel_min_macs = int64_t{1} << 17);

  // Computes every task (their outputs must not overlap).
  void Run(const std::vector<MatmulTask>& tasks);
  void Run(WeightLayout layout, const MatmulArgs& args, const MatmulEpilogue& epilogue = {});

  // Computes first[i] and then second[i], which may read first[i]'s output
  // (an expert's up projection, then its down projection), for every i; no
  // output overlaps another, nor an input of another pair. Where the pairs
  // have few rows each (a decode step's experts, whose weights come from
  // memory) and there are at least two per thread, each piece is one pair
  // whole: one parallel region instead of two, and the rows between the two
  // products stay in the cache of the core that wrote them. Otherwise
  // Run(first), then Run(second). The same bits either way (matmul.h: no
  // element depends on the rows and columns a call covers).
  void RunPairs(const std::vector<MatmulTask>& first, const std::vector<MatmulTask>& second);

  const MatmulKernels& kernels() const { return *kernels_; }
  int threads() const { return pool_ == nullptr ? 1 : pool_->threads(); }
  // Work smaller than this (multiply-adds) stays on the calling thread.
  int64_t parallel_min_macs() const { return parallel_min_macs_; }

 private:
  const MatmulKernels* kernels_;
  WorkerPool* pool_;
  int64_t parallel_min_macs_;
  std::vector<MatmulTask> pieces_;
  std::vector<MatmulTask> single_;
  std::vector<int> order_;  // the pieces (Run) or pairs (RunPairs), largest first
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_MATMUL_RUNNER_H_
