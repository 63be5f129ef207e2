// The feed-forward layer of the CPU backend: dense, or MoE (Switch / sigma-MoE)
// with capacity-aware dispatch and grouped expert matmuls (the tokens routed
// to an expert gathered, one GEMM pair per active expert, scaled by their gate
// and scattered back).
//
// Not thread-safe: owns scratch buffers reused across calls.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_FFN_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_FFN_H_

#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "kernels/cpu/cpu_step.h"

namespace switchserve::cpu {

class CpuFfn {
 public:
  CpuFfn(const ModelConfig& config, const DispatchConfig& dispatch);

  // x[T, d] += FFN(xn[T, d]). The MoE router is recorded at `router_index`.
  void Run(const FfnWeights& w, int tokens, const float* xn, float* x, int router_index,
           const RoutingRecorder& recorder);

 private:
  FfnConfig ffn_;
  DispatchConfig dispatch_;
  int d_ = 0;

  std::vector<float> logits_;   // [T, X]
  std::vector<float> gather_;   // [T, d]
  std::vector<float> hidden_;   // [T, F]
  std::vector<float> product_;  // [T, d]
  RouterDecision decision_;
  ExpertAssignments assignments_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_FFN_H_
