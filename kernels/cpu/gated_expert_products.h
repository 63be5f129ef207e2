// The products of a module's experts whose rows go back into token rows,
// scaled by their gates (SwitchHead's output experts). Where the experts
// have many rows each (prefill), each expert's product is computed a block
// of columns and of tokens at a time and added to its tokens' rows at once,
// while they are in the cache, instead of being written whole ([slots, n]:
// 16 MiB for a 512-token prefill of the paper's output experts) and read
// back, by the kernels themselves (MatmulArgs::c_scale: from the AVX-512
// build's many-row rows-in tiles' registers, elsewhere through a small
// per-thread buffer). (From the registers rather than a buffer then
// AddScaledRow: a 512-token prefill's output experts over its value experts
// in the same steps, engine_bench, bf16, Intel Xeon (Emerald Rapids) VM,
// three alternated runs: 1.18-1.22 -> 1.10-1.13.) A few rows each (decode)
// take the products whole (MatmulRunner) and then AddExpertOutputs.
//
// Both give the same bits: no product element depends on the rows and
// columns a call covers (matmul.h), a token has at most one slot per expert,
// and a block's tasks are added in task order, so each row receives the same
// additions in the same order.
//
// Not thread-safe: owns per-thread scratch, reused across calls.
#ifndef SWITCHSERVE_KERNELS_CPU_GATED_EXPERT_PRODUCTS_H_
#define SWITCHSERVE_KERNELS_CPU_GATED_EXPERT_PRODUCTS_H_

#include <cstdint>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul_runner.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {

// One expert's product: `product` covers all of the expert's slots (args.m =
// assignments->count(expert); row i of a is that of slot begin(expert) + i;
// args.c, ldc and accumulate unused; its epilogue must be empty: the blocks
// that sum products as they go would not apply it).
struct GatedExpertTask {
  MatmulTask product;
  const ExpertAssignments* assignments = nullptr;
  int expert = 0;
};

class GatedExpertProducts {
 public:
  // `runner` and `pool` must outlive this object.
  GatedExpertProducts(MatmulRunner* runner, WorkerPool* pool);

  // For every task in order, every slot s of its expert:
  //   dst[token(s), 0 .. n) += weight(s) * product row of s
  // one multiply and one add per element, as AddExpertOutputs adds them when
  // the tasks come in (group, expert) order. Every task's product has n
  // columns; `tokens` bounds the assignments' token indices. A group's
  // tasks come together, one for each of its experts with slots, in
  // increasing order; consecutive groups with the same assignments (a
  // shared router) therefore have the same experts.
  void Run(const std::vector<GatedExpertTask>& tasks, int n, int tokens, float* dst,
           int64_t dst_stride);

 private:
  struct Scratch {
    std::vector<int32_t> rows;    // the rows of a a token block reads
    std::vector<int32_t> tokens;  // and their slots' tokens
    std::vector<float> weights;   // and gates
  };
  // Tasks' columns [j0, j0 + cols) for the tokens [t0, t1).
  void RunBlock(const std::vector<GatedExpertTask>& tasks, int t0, int t1, int j0, int cols,
                int tokens, float* dst, int64_t dst_stride, Scratch& scratch) const;
  // Every product whole (`rows` in all), then AddExpertOutputs.
  void RunWhole(const std::vector<GatedExpertTask>& tasks, int n, int tokens, int64_t rows,
                float* dst, int64_t dst_stride);

  MatmulRunner* runner_;
  WorkerPool* pool_;
  std::vector<Scratch> scratch_;  // per pool slot
  std::vector<float> product_;    // RunWhole's products, [slots, n]
  std::vector<MatmulTask> whole_;
  std::vector<ExpertOutputs> outputs_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_GATED_EXPERT_PRODUCTS_H_
