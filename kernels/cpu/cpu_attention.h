// One attention layer of the CPU backend over the paged KV cache: SwitchHead
// (routed V and O, E > 1; or E = 1 with per-head output gates) and dense
// multi-head attention, each optionally with grouped K/V heads, with RoPE or
// XL relative positions (cpu_xl_positions.h). The math is docs/design.md's
// and docs/model-format.md's; the storage layout of one layer's cache is
//   K: [cache rows, G, dh]          (after RoPE if any, scaled by dh^-1/4)
//   V: [cache rows, G * Ev, dh]     (Ev = E with destination value routing, else 1)
// with cache row = block * block_size + position % block_size.
//
// Not thread-safe: owns scratch buffers reused across calls; shares its work
// out on the backend's worker pool.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_ATTENTION_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_ATTENTION_H_

#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/step_batch.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_step.h"
#include "kernels/cpu/cpu_xl_positions.h"
#include "kernels/cpu/gated_expert_products.h"
#include "kernels/cpu/matmul_runner.h"
#include "kernels/cpu/one_row_weights.h"
#include "kernels/cpu/paged_attention.h"

namespace switchserve::cpu {

class CpuAttention {
 public:
  // `runner` (the projections' matmuls), `pool` and `one_row` (the weights'
  // copies for products of one row) must outlive this layer. Steps whose
  // attention proper needs fewer multiply-adds than `parallel_min_macs`
  // attend on the calling thread.
  CpuAttention(const ModelConfig& config, const DispatchConfig& dispatch, KernelIsa isa,
               MatmulRunner* runner, WorkerPool* pool, const OneRowWeights* one_row,
               int64_t parallel_min_macs);

  // x[T, d] += Attn(xn[T, d]) for the step. Writes the step's keys and values
  // to `cache` (this layer's; rounded to nearest even when bf16) before
  // attending. Value routers are recorded at router indices [router_base,
  // router_base + ValueRouterHeads()), output routers right after them
  // (routed attention only). `positions`: this layer's XL position keys
  // (empty with RoPE).
  void Run(const AttentionWeights& w, const StepBatch& step, const float* xn, float* x,
           const KvLayerCache& cache, const XlPositionKeys& positions, int router_base,
           const RoutingRecorder& recorder);

 private:
  // q, k, the router logits and (unrouted) v: the products of xn.
  void ProjectInputs(const AttentionWeights& w, const StepBatch& step, const float* xn);
  // Routed values: the expert products, and in outputs_ (source routing)
  // what each token's v row sums, which Run adds with the cache appends.
  void ComputeValues(const AttentionWeights& w, const StepBatch& step, const float* xn,
                     int router_base, const RoutingRecorder& recorder);
  void ProjectOutput(const AttentionWeights& w, const StepBatch& step, const float* xn, float* x,
                     int router_base, const RoutingRecorder& recorder);
  GateFunction gate() const;

  AttentionConfig attn_;
  DispatchConfig dispatch_;
  MatmulRunner* runner_;
  WorkerPool* pool_;
  const OneRowWeights* one_row_;
  int d_ = 0;
  RopeTable rope_;
  PagedAttention paged_;
  GatedExpertProducts gated_;  // the output experts

  // Scratch, grown as needed and reused.
  std::vector<float> q_;              // [T, H*dh]
  std::vector<float> k_;              // [T, G*dh]
  std::vector<float> v_;              // [T, G*Ev*dh]
  std::vector<float> a_;              // [T, H*dh] attention output
  std::vector<float> value_logits_;   // [T, value routers*E]
  std::vector<float> output_logits_;  // [T, output routers*E] (E = 1: [T, H])
  std::vector<float> vweight_;        // destination routing: [T, G, E] value gate weights
  std::vector<float> product_;        // [routed slots, dh] value expert outputs
  std::vector<MatmulTask> tasks_;
  std::vector<ExpertOutputs> outputs_;  // source-routed values' sums, or none
  std::vector<GatedExpertTask> gated_tasks_;
  std::vector<ExpertAssignments> assignments_;  // per router head
  StepRouters routers_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_ATTENTION_H_
