// The CPU implementation of Backend: f32 weights, OpenBLAS sgemm for every
// projection and for the grouped expert matmuls (tokens gathered per expert,
// one GEMM per active expert), attention over the paged cache vectorised and
// spread across the machine's cores with OpenMP; the next token sampled on
// the host by the runtime's sampler (engine/runtime/sampler.h). Created
// through kernels/backends.h.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/backend.h"

namespace switchserve {

struct CpuBackendOptions {
  int num_threads = 0;  // 0: all cores
  // Steps whose attention needs fewer multiply-adds than this attend on one
  // thread (waking the OpenMP team costs more than it saves on decode steps).
  // Tests set 0 to exercise the parallel path on tiny models.
  int64_t parallel_attention_min_macs = int64_t{1} << 22;
  // XL positions: the most bytes the position tables (n_layers * n_heads *
  // max_seq_len * head_dim floats, cpu_xl_positions.h) may take; 0: this
  // host's memory (HostMemoryBytes, as for the KV cache and the weights).
  int64_t max_position_table_bytes = 0;
};

// `weights` must outlive the backend and match `config` (ValidateWeights).
// `dispatch` is the capacity policy in force (the model's, or the server's
// override). With XL positions the position tables are computed here:
// RESOURCE_EXHAUSTED when they exceed options.max_position_table_bytes or
// cannot be allocated.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const ModelConfig& config,
                                                          const ModelWeights& weights,
                                                          const DispatchConfig& dispatch,
                                                          const CpuBackendOptions& options = {});

}  // namespace switchserve

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_BACKEND_H_
