// The CUDA backend's class, shared by its source files: cuda_backend.cc
// (creation, the KV cache, Forward, the output head and sampling),
// cuda_layers.cc (attention and feed-forward layers, routing). Internal.
#ifndef SWITCHSERVE_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_
#define SWITCHSERVE_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/moe/router_layout.h"
#include "engine/runtime/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_step.h"
#include "kernels/cuda/decode_graphs.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/device_weights.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/route_topk.h"
#include "kernels/cuda/step_ops.h"

namespace switchserve::cuda {

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const ModelConfig& config,
                                                         const ModelWeights& weights,
                                                         const DispatchConfig& dispatch,
                                                         const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return name_; }
  DType kv_cache_dtype() const override { return sixteen_bit_ ? DType::kBF16 : DType::kF32; }
  int64_t KvBytesPerToken() const override;
  absl::Status InitKvCache(int64_t num_blocks, int block_size) override;
  absl::Status Forward(const StepBatch& batch, StepOutput* out) override;

 private:
  CudaBackend(const ModelConfig& config, const DispatchConfig& dispatch,
              const CudaBackendOptions& options);

  // Device work buffers, sized for the largest step so far.
  struct Workspace {
    DeviceBuffer x, xn, qk, v, a, router_logits, route_expert, route_weight, route_prob;
    DeviceBuffer offsets, slot_token, slot_weight, assign_slot, prod, hidden, partials;
    DeviceBuffer value_weights, head_in, head_norm, sampling, dispatch_loads, dispatch_taken;
  };

  // cuda_backend.cc
  absl::Status RunStep(const StepBatch& batch, int real_tokens, int bucket);
  // Every launch of the step, after its upload: what a decode graph holds.
  absl::Status Launches();
  absl::Status GrowWorkspace();
  // Test only (CudaBackendOptions::forced_routing): the step's traces.
  absl::Status UploadForcedRouting(const StepBatch& batch);
  absl::Status OutputHead();
  // The RoPE tables and (XL positions) every layer's table of position keys
  // (xl_positions.h), for table_positions_ positions.
  absl::Status TabulatePositions();
  absl::Status TabulateXlPositions();
  absl::Status Sample();

  // cuda_layers.cc
  absl::Status Attention(int layer);
  absl::Status Ffn(int layer);
  // Router logits [T, routers * E] (row stride ld) -> top-k -> capacity
  // dispatch of `routers` routers of one module, recorded at RouterLayout
  // index `router_index` onwards.
  absl::Status Route(const float* logits, int64_t ld, int routers, int n_experts, int top_k,
                     GateType gate, bool renormalize, int router_index);
  // Slots an expert can hold this step (the grid bound of grouped products).
  int MaxExpertRows(int top_k, int n_experts) const;
  // The slots the last Route planned, as rows of a grouped product: each
  // expert's slots gather their token's row of the input; `heads` planes of
  // output, one per router head (router 0 for every head if shared_router).
  GroupedRows DispatchedRows(int top_k, int n_experts, int heads, bool shared_router) const;
  // The gates and slots of the assignments Route recorded at RouterLayout
  // index `router_index` onwards (dropped ones carry no slot).
  Assignments KeptAssignments(int router_index, int top_k) const;
  // Combine of the per-slot products `prod` [slots, width] of `kept` into
  // `out` (row stride out_ld) for every token of the step; one head, not
  // accumulating, unless the caller sets them.
  CombineArgs KeptCombine(const Assignments& kept, const float* prod, int width, float* out,
                          int64_t out_ld) const;

  const ModelConfig config_;
  const DispatchConfig dispatch_;
  const CudaBackendOptions options_;
  const RouterLayout layout_;
  std::string name_;
  bool sixteen_bit_ = true;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceWeights> weights_;
  DeviceBuffer rope_cos_, rope_sin_;   // [table_positions_, rotary dims / 2]
  std::vector<DeviceBuffer> xl_keys_;  // XL positions: per layer [H, table_positions_, dh]
  int table_positions_ = 0;            // min(max_seq_len, the KV cache's rows)

  // KV cache: per layer, K [rows, G, dh] and V [rows, G * Ev, dh]; one block
  // beyond num_blocks_ takes the writes of padding rows.
  int64_t num_blocks_ = 0;
  int block_size_ = 0;
  std::vector<DeviceBuffer> k_cache_, v_cache_;
  int query_tile_ = 1;
  int segment_tokens_ = 1;

  std::unique_ptr<StepIo> io_;
  Workspace ws_;
  uint64_t workspace_epoch_ = 0;  // counts reallocations of ws_ (decode_graphs.h)
  DecodeGraphs graphs_;
  StepBatch padded_;
  StepGroupLoads group_loads_;  // the step's carried capacity loads
};

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_
