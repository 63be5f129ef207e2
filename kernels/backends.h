// Creates a Backend by device. The one place that knows which backends this
// build has: the server, the offline commands, the benchmarks and the tests
// reach every backend through CreateBackend, never through a backend's own
// header.
#ifndef SWITCHSERVE_KERNELS_BACKENDS_H_
#define SWITCHSERVE_KERNELS_BACKENDS_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/backend.h"
#include "kernels/cpu/blas_threads.h"  // RestartWithoutBlasThreads, for main()s
#include "kernels/cpu/kernel_isa.h"
#include "kernels/cpu/pool_job_span.h"

namespace switchserve {

enum class DeviceKind { kCpu, kCuda, kAuto };

// "cpu", "cuda", "auto".
std::string_view ToString(DeviceKind device);
// The inverse of ToString; INVALID_ARGUMENT names the accepted values.
absl::StatusOr<DeviceKind> ParseDeviceKind(std::string_view text);
// A device of BuiltDevices() as `--version` names it: ToString's, and
// "cuda (emulated)" for the CUDA backend on the SIMT executor (test builds).
std::string BuiltDeviceName(DeviceKind device);

// Element type of the KV cache (--kv-cache-dtype). kAuto: what the weight
// matrices the backend computes with imply, as a model's dtype decides the
// cache's in vLLM and TGI. The CUDA backend: bf16 with its 16-bit matrices,
// f32 with cuda_f32_weights. The CPU backend: bf16 with bf16 matrices (a
// bf16 model, or --weights-dtype bf16); f32 with f32 or f16 ones (f16 widens
// to f32 exactly, so such a model computes the f32 math, and keeps it).
// kBF16 halves the bytes a token's keys and values take and the bytes
// attention reads.
enum class KvCacheDtype { kAuto, kF32, kBF16 };

// "auto", "f32", "bf16".
std::string_view ToString(KvCacheDtype dtype);
// The inverse of ToString; INVALID_ARGUMENT names the accepted values.
absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view text);

struct BackendOptions {
  int num_threads = 0;  // host threads the backend computes with; 0: all cores
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // CPU: keep tiled copies of the weight matrices for the products of one
  // row (CpuBackendOptions::one_row_weights) where the host's memory has room
  // for them: faster batch-1 decode, for about those matrices' bytes again in
  // host memory. Same bits either way.
  bool cpu_weight_copies = true;
  // CPU: the build of the kernels (CpuBackendOptions::kernel_isa); none: the
  // fastest this CPU supports.
  std::optional<cpu::KernelIsa> cpu_kernels = std::nullopt;
  // CUDA: keep every weight matrix in f32 (the parity mode) instead of 16-bit.
  bool cuda_f32_weights = false;
  // What ModelLoadOptions::allow_non_finite_weights (--allow-non-finite-weights)
  // allows the loader, for the weights a backend narrows itself: the CUDA
  // backend's 16-bit matrices make a finite f32 weight beyond bf16's range
  // infinite. Unset, such a weight is refused, naming the tensor; set, it is
  // held so, with a line in `warnings`.
  bool allow_non_finite_weights = false;
  // CUDA: keys per attention segment (CudaBackendOptions); 0: its default.
  // Every path of a backend uses the same value, so a request's logits stay
  // bitwise the same in decode and prefill; another value rounds differently.
  int cuda_attention_segment_tokens = 0;
  // When set, warning lines for the caller to report. kAuto: one for each
  // built device passed over before the one chosen, and why ("--device auto:
  // passed over cuda (no CUDA device); the cpu backend runs instead"): a GPU
  // host whose CUDA backend refuses the model (a head_dim it does not
  // support, a weight past bf16's range) serves it on the CPU, and says so.
  // And one for each weight allow_non_finite_weights let the created backend
  // hold non-finite.
  std::vector<std::string>* warnings = nullptr;
};

// The KV cache element type a `device` backend (kCpu or kCuda) holds under
// `options` for `weights`: kAuto resolved (see KvCacheDtype). CreateBackend
// refuses a CUDA backend asked for another type than its weights imply.
KvCacheDtype HeldKvCacheDtype(DeviceKind device, const BackendOptions& options,
                              const ModelWeights& weights);

// The devices this build has a backend for, most preferred first. Never
// contains kAuto; always contains kCpu.
std::vector<DeviceKind> BuiltDevices();

// A backend for `device` running `config` with `weights` (which must outlive
// it and match the config, see ValidateWeights) under the capacity policy
// `dispatch`. Its KV cache is not initialised yet (KvCache does that).
// kAuto: the first of BuiltDevices() whose backend can be created (the
// others in options.warnings).
// FAILED_PRECONDITION when this build has no backend for `device`.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceKind device, const ModelConfig& config,
                                                       const ModelWeights& weights,
                                                       const DispatchConfig& dispatch,
                                                       const BackendOptions& options = {});

// What a device's hardware can do, measured now in this process, for
// benchmarks to compare with: device-to-device copy bandwidth (bytes read
// plus written) and the bf16 GEMM rate (cuBLAS). `small`: tiny sizes (smoke
// runs, the emulated build). FAILED_PRECONDITION for a device this build has
// no backend for, or without a usable device; UNIMPLEMENTED for the CPU
// (bench/roofline.h measures it).
struct DeviceLimits {
  std::string device;  // the hardware's name
  double copy_gb_per_s = 0;
  double gemm_tflops = 0;
};
absl::StatusOr<DeviceLimits> MeasureDeviceLimits(DeviceKind device, bool small = false);

// A timeline of the CPU backend's parallel work (engine_bench
// --pool-timeline): from now on every job its worker pools share out is
// appended to `spans`, until called with null (cpu::WorkerPool::RecordJobs).
void RecordCpuPoolJobs(std::vector<cpu::PoolJobSpan>* spans);

}  // namespace switchserve

#endif  // SWITCHSERVE_KERNELS_BACKENDS_H_
