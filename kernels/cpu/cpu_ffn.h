// The feed-forward layer of the CPU backend: dense, or MoE (Switch / sigma-MoE)
// with capacity-aware dispatch and grouped expert matmuls: each active expert
// reads the rows its router sent it in place, all experts' products of one
// matrix run as one group on the backend's threads, and each token's kept
// outputs are added back, scaled by their gates, in expert order.
//
// Not thread-safe: owns scratch buffers reused across calls.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_FFN_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_FFN_H_

#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_step.h"
#include "kernels/cpu/matmul_runner.h"
#include "kernels/cpu/one_row_weights.h"

namespace switchserve::cpu {

class CpuFfn {
 public:
  // `runner`, `pool` and `one_row` (the weights' copies for products of one
  // row) must outlive this layer.
  CpuFfn(const ModelConfig& config, const DispatchConfig& dispatch, MatmulRunner* runner,
         WorkerPool* pool, const OneRowWeights* one_row);

  // x[T, d] += FFN(xn[T, d]). The MoE router is recorded at `router_index`.
  void Run(const FfnWeights& w, int tokens, const float* xn, float* x, int router_index,
           const RoutingRecorder& recorder);

 private:
  FfnConfig ffn_;
  DispatchConfig dispatch_;
  int d_ = 0;
  MatmulRunner* runner_;
  WorkerPool* pool_;
  const OneRowWeights* one_row_;

  std::vector<float> logits_;           // [T, X]
  std::vector<float> hidden_;           // [slots, F] (dense: [T, F])
  std::vector<float> product_;          // [slots, d]
  std::vector<MatmulTask> tasks_;       // the experts' up projections
  std::vector<MatmulTask> down_tasks_;  // and their down projections
  std::vector<ExpertOutputs> outputs_;
  ExpertAssignments assignments_;
  StepRouters routers_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_FFN_H_
