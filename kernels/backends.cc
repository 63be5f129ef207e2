#include "kernels/backends.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/worker_pool.h"
#if defined(SWITCHSERVE_HAVE_CUDA_BACKEND)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace switchserve {

std::string_view ToString(DeviceKind device) {
  switch (device) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(std::string_view text) {
  for (DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kAuto}) {
    if (text == ToString(device)) return device;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected cpu, cuda or auto, found \"", std::string(text), "\""));
}

std::string_view ToString(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kF32:
      return "f32";
    case KvCacheDtype::kBF16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view text) {
  for (KvCacheDtype dtype : {KvCacheDtype::kAuto, KvCacheDtype::kF32, KvCacheDtype::kBF16}) {
    if (text == ToString(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected auto, f32 or bf16, found \"", std::string(text), "\""));
}

namespace {

// What kAuto means on `device`: the cache follows the weight matrices. The
// CUDA backend holds them in 16 bits unless asked for f32. The CPU backend
// computes from them as loaded, and the key projection (whose outputs the
// cache holds) stands for them all: bf16 matrices get a bf16 cache, while f16
// ones, which widen to f32 exactly and so compute the f32 model, keep f32.
KvCacheDtype OwnKvCacheDtype(DeviceKind device, const BackendOptions& options,
                             const ModelWeights& weights) {
  const bool bf16 =
      device == DeviceKind::kCuda
          ? !options.cuda_f32_weights
          : !weights.layers.empty() && weights.layers[0].attn.k.dtype() == DType::kBF16;
  return bf16 ? KvCacheDtype::kBF16 : KvCacheDtype::kF32;
}

}  // namespace

KvCacheDtype HeldKvCacheDtype(DeviceKind device, const BackendOptions& options,
                              const ModelWeights& weights) {
  return options.kv_cache_dtype != KvCacheDtype::kAuto ? options.kv_cache_dtype
                                                       : OwnKvCacheDtype(device, options, weights);
}

std::string BuiltDeviceName(DeviceKind device) {
#if defined(SWITCHSERVE_HAVE_CUDA_BACKEND)
  if (device == DeviceKind::kCuda && CudaBackendIsEmulated()) return "cuda (emulated)";
#endif
  return std::string(ToString(device));
}

std::vector<DeviceKind> BuiltDevices() {
  // A device backend built into this binary adds itself here, ahead of the CPU.
#if defined(SWITCHSERVE_HAVE_CUDA_BACKEND)
  return {DeviceKind::kCuda, DeviceKind::kCpu};
#else
  return {DeviceKind::kCpu};
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceKind device, const ModelConfig& config,
                                                       const ModelWeights& weights,
                                                       const DispatchConfig& dispatch,
                                                       const BackendOptions& options) {
  if (device == DeviceKind::kAuto) {
    // The first built device whose backend can be had (a CUDA build on a
    // machine without a GPU falls back to the CPU).
    absl::Status first_error;
    std::vector<std::string> reasons;
    for (DeviceKind built : BuiltDevices()) {
#if defined(SWITCHSERVE_HAVE_CUDA_BACKEND)
      // The CUDA backend on the SIMT executor (test builds) runs only when
      // asked for by name.
      if (built == DeviceKind::kCuda && CudaBackendIsEmulated()) {
        reasons.push_back("cuda (the CUDA backend on the SIMT executor runs only when asked for)");
        continue;
      }
#endif
      auto backend = CreateBackend(built, config, weights, dispatch, options);
      if (backend.ok()) {
        if (options.warnings != nullptr) {
          for (const std::string& reason : reasons) {
            options.warnings->push_back(absl::StrCat("--device auto: passed over ", reason,
                                                     "; the ", std::string((*backend)->name()),
                                                     " backend runs instead"));
          }
        }
        return backend;
      }
      if (first_error.ok()) first_error = backend.status();
      reasons.push_back(
          absl::StrCat(std::string(ToString(built)), " (", backend.status().message(), ")"));
    }
    return first_error;
  }
  switch (device) {
    case DeviceKind::kCpu: {
      CpuBackendOptions cpu;
      cpu.num_threads = options.num_threads;
      cpu.one_row_weights = options.cpu_weight_copies;
      cpu.kernel_isa = options.cpu_kernels;
      cpu.kv_cache_dtype =
          HeldKvCacheDtype(DeviceKind::kCpu, options, weights) == KvCacheDtype::kBF16 ? DType::kBF16
                                                                                      : DType::kF32;
      return CreateCpuBackend(config, weights, dispatch, cpu);
    }
    case DeviceKind::kCuda:
#if defined(SWITCHSERVE_HAVE_CUDA_BACKEND)
    {
      const KvCacheDtype held = OwnKvCacheDtype(DeviceKind::kCuda, options, weights);
      if (options.kv_cache_dtype != KvCacheDtype::kAuto && options.kv_cache_dtype != held) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the CUDA backend's KV cache is ", std::string(ToString(held)), " with ",
            options.cuda_f32_weights ? "f32 weights (--weights-dtype f32)"
                                     : "16-bit weights (f32 ones with --weights-dtype f32)",
            ", not ", std::string(ToString(options.kv_cache_dtype))));
      }
      CudaBackendOptions cuda;
      cuda.sixteen_bit_weights = !options.cuda_f32_weights;
      cuda.allow_non_finite_weights = options.allow_non_finite_weights;
      cuda.warnings = options.warnings;
      if (options.cuda_attention_segment_tokens > 0) {
        cuda.attention_segment_tokens = options.cuda_attention_segment_tokens;
      }
      return CreateCudaBackend(config, weights, dispatch, cuda);
    }
#else
      break;
#endif
    case DeviceKind::kAuto:
      break;
  }
  std::string built;
  for (DeviceKind d : BuiltDevices()) {
    absl::StrAppend(&built, built.empty() ? "" : ", ", std::string(ToString(d)));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "this build has no ", std::string(ToString(device)), " backend (built: ", built, ")"));
}

absl::StatusOr<DeviceLimits> MeasureDeviceLimits(DeviceKind device, [[maybe_unused]] bool small) {
  if (device == DeviceKind::kCpu) {
    return absl::UnimplementedError("the CPU's limits are measured by bench/roofline.h");
  }
#if defined(SWITCHSERVE_HAVE_CUDA_BACKEND)
  if (device == DeviceKind::kCuda) {
    auto measured = MeasureCudaDeviceLimits(small);
    if (!measured.ok()) return measured.status();
    DeviceLimits limits;
    limits.device = measured->device;
    limits.copy_gb_per_s = measured->copy_gb_per_s;
    limits.gemm_tflops = measured->gemm_tflops;
    return limits;
  }
#endif
  return absl::FailedPreconditionError(
      absl::StrCat("this build has no ", std::string(ToString(device)), " backend"));
}

void RecordCpuPoolJobs(std::vector<cpu::PoolJobSpan>* spans) { cpu::WorkerPool::RecordJobs(spans); }

}  // namespace switchserve
