// The CPU implementation of Backend: weights used as held (f32, bf16 or f16),
// every projection and the grouped expert matmuls (all active experts of a
// module in one group of products over the rows routed to them) run on our
// batch-invariant kernels (kernels/cpu/matmul.h), attention over the paged
// cache in one operation order per query (paged_attention.h), the work of
// both shared out on the backend's worker pool; the next token sampled on
// the host by the runtime's sampler
// (engine/runtime/sampler.h). Created through kernels/backends.h.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/backend.h"
#include "kernels/cpu/kernel_isa.h"

namespace switchserve {

struct CpuBackendOptions {
  int num_threads = 0;  // 0: all cores
  // Steps whose attention needs fewer multiply-adds than this attend on one
  // thread (waking the workers costs more than it saves on small steps).
  // A decode step's attention streams its keys and values from memory (4
  // bytes per multiply-add with an f32 cache, ~10 us at this threshold), so
  // it pays to share out early: at batch 32, context 128 of the paper's shape
  // (3.7M multiply-adds a layer) one thread took a third of the step, and at
  // batch 1 (115k) 4-6% of it.
  // Tests set 0 to exercise the parallel path on tiny models.
  int64_t parallel_attention_min_macs = int64_t{1} << 15;
  // A group of matmuls with fewer multiply-adds runs on one thread. Tests set
  // 0 to exercise the split across threads on tiny models.
  int64_t parallel_matmul_min_macs = int64_t{1} << 17;
  // Steps with two sampling sequences or more share them out over the
  // threads where the vocabulary has at least this many ids (a draw reads
  // its row several times: about 0.8 ms at 32,000 ids, a few microseconds at
  // 256, less than waking the workers). Tests set 0 to exercise it on tiny
  // models.
  int parallel_sampling_min_vocab = 4096;
  // The build of the kernels to run (kernel_isa.h); none: the fastest this
  // CPU supports. CreateCpuBackend refuses one the CPU cannot run. kAvx2 and
  // kAvx512 give the same bits; kGeneric rounds differently (matmul.h).
  std::optional<cpu::KernelIsa> kernel_isa = std::nullopt;
  // XL positions: the most bytes the position tables (n_layers * n_heads *
  // max_seq_len * head_dim floats, cpu_xl_positions.h) may take; 0: this
  // host's memory (HostMemoryBytes, as for the KV cache and the weights).
  int64_t max_position_table_bytes = 0;
  // Element type of the KV cache: kF32, or kBF16 (half the bytes per token;
  // keys and values rounded to nearest even as they are written, so a
  // request's logits differ slightly from the f32 cache's, and stay the same
  // whatever its neighbours).
  DType kv_cache_dtype = DType::kF32;
  // Keep tiled copies of weight matrices for the products of one row
  // (kernels/cpu/one_row_weights.h): a batch-1 decode step streams them
  // faster, for about those weights' bytes again in memory. Same bits either
  // way. Made in InitKvCache, where the weights, the KV cache, the position
  // tables and the copies fit in 90% of host_memory_bytes (the rest left to
  // activations, the server and the allocator); else left out
  // (Backend::weight_copies().skipped_bytes), so that a model which fits
  // without them still starts.
  bool one_row_weights = true;
  // The host memory the KV cache must fit in beside the weights and the
  // position tables, and the weight copies are fitted into; 0:
  // HostMemoryBytes() (the physical memory, or the cgroup's limit). Tests
  // set it.
  int64_t host_memory_bytes = 0;
  // What the process holds when more than the backend's weights and tables
  // (its libraries, the runtime's buffers), counted beside the KV cache and
  // the copies; -1: ResidentBytes() at the time with the host's own memory,
  // none with a `host_memory_bytes` given. Tests set it.
  int64_t resident_bytes = -1;
};

// The host memory the backend's holdings may take: all but a tenth of
// `host_memory_bytes`, the rest left to activations, the server and the
// allocator. The KV cache must fit in it beside the weights and the XL
// position tables, and the weight copies beside those three to be made.
constexpr int64_t HostMemoryBudget(int64_t host_memory_bytes) {
  return host_memory_bytes - host_memory_bytes / 10;
}

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
