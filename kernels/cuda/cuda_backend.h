// The CUDA implementation of Backend: the model's layers as our own kernels
// (kernels/cuda/*.cu) over weights and a paged KV cache in device memory,
// sampling on the device, one upload and one download per step. Created
// through kernels/backends.h.
//
// Numerics: weights in bf16 as stored (f16 kept as f16; f32 checkpoints
// rounded to bf16 once at load) or all f32 (WeightFormat::kFloat32, the
// parity mode); activations, the residual stream, norms, softmax and every
// accumulation in f32; routers in f32 (f32 weights, fmaf chains, no TF32).
// The KV cache is bf16 (f32 in the f32 mode), paged with the runtime's block
// tables.
//
// Isolation (docs/design.md): every kernel reduces a token's sums in an order
// fixed by the token alone (linear.h, attention.h), so a request's logits do
// not depend on the rest of the step; routing follows the configured
// dispatch scope, decided on the device bit-identically to the CPU's
// expert_dispatch.
//
// Two builds of the same sources (kernels/cuda/README.md): with nvcc for a
// GPU, and with g++ on the SIMT executor, which runs every kernel on the CPU
// (tests and CI). A binary links one of them; CudaBackendIsEmulated() says
// which. The emulated backend names itself "cuda (emulated)" and is never
// picked by --device auto.
//
// Not thread-safe (Backend's contract). Owns one CUDA stream.
#ifndef SWITCHSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define SWITCHSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/moe/routing.h"
#include "engine/runtime/backend.h"

namespace switchserve {

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal
  // false: every matrix in f32 (parity tests); true: 16-bit as stored.
  bool sixteen_bit_weights = true;
  // A finite f32 weight that the 16-bit matrices would make infinite (beyond
  // bf16's range) is refused, naming the tensor; set
  // (ModelLoadOptions::allow_non_finite_weights, --allow-non-finite-weights),
  // it is held so and a line naming it is appended to `warnings` (read only
  // while the backend is created; may be null).
  bool allow_non_finite_weights = false;
  std::vector<std::string>* warnings = nullptr;
  // Steps whose every sequence decodes one token run from CUDA graphs
  // captured per batch-size bucket (1, 2, 4, ..., 256 sequences), padded with
  // rows that touch nothing of the real ones. Under emulation the padded step
  // runs eagerly (the executor has no graphs).
  bool decode_graphs = true;
  // Keys per attention segment (rounded up to whole KV blocks): contexts
  // longer than this are split into segments computed in parallel and merged
  // (attention.h). 0: 128 keys, or max_seq_len / 64 where that is more (the
  // merge scratch holds max_seq_len / segment partials per token and head).
  // Tests lower it.
  int attention_segment_tokens = 0;
  // Test only: when set, the routers' choices come from these traces instead
  // of the router logits (a step of one sequence; entry t is the routing of
  // its token t, RouterLayout order, as the CPU backend reports it).
  const std::vector<TokenRouting>* forced_routing = nullptr;
};

// A CUDA backend for `config` with `weights` (which must outlive it) under
// the capacity policy `dispatch`. FAILED_PRECONDITION when no usable device
// is present (the message names CUDA's error); RESOURCE_EXHAUSTED when the
// weights do not fit.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const ModelConfig& config,
                                                           const ModelWeights& weights,
                                                           const DispatchConfig& dispatch,
                                                           const CudaBackendOptions& options = {});

// True when this binary's CUDA backend runs on the SIMT executor.
bool CudaBackendIsEmulated();

// The devices this process can use, as "N device(s): name (sm_XY, M GiB), ..."
// or why none can be used.
std::string DescribeCudaDevices();

// Device 0's limits, measured now (benchmarks compare with them): the
// device-to-device copy bandwidth (bytes read plus written, 1 GiB) and the
// bf16 GEMM rate of the GEMM wrapper (cuBLAS, 8192^3, f32 accumulation), on
// random data, best of 5 after a warm-up. `small`: 16 MiB and 256^3 (the
// emulated build, smoke runs). FAILED_PRECONDITION without a device.
struct CudaDeviceLimits {
  std::string device;
  double copy_gb_per_s = 0;
  double gemm_tflops = 0;
  int64_t copy_bytes = 0;
  int gemm_size = 0;
};
absl::StatusOr<CudaDeviceLimits> MeasureCudaDeviceLimits(bool small);

}  // namespace switchserve

#endif  // SWITCHSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
