#include "tests/util/backends_under_test.h"

#include <limits>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace switchserve::testing {
namespace {

// The backend, or a test failure (and null) when it cannot be created.
std::unique_ptr<Backend> OrFail(absl::StatusOr<std::unique_ptr<Backend>> backend) {
  if (!backend.ok()) {
    ADD_FAILURE() << "cannot create the backend: " << backend.status();
    return nullptr;
  }
  return *std::move(backend);
}

#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
// The CUDA backend in its f32 parity mode (the goldens' tolerances hold), with
// short attention segments so that the suites' contexts span several.
std::unique_ptr<Backend> CudaF32(const ModelConfig& config, const ModelWeights& weights,
                                 const DispatchConfig& dispatch) {
  CudaBackendOptions options;
  options.sixteen_bit_weights = false;
  options.attention_segment_tokens = 16;
  return OrFail(CreateCudaBackend(config, weights, dispatch, options));
}
#endif

}  // namespace

const std::vector<BackendUnderTest>& BackendsUnderTest() {
  static const std::vector<BackendUnderTest>* const backends = new std::vector<BackendUnderTest> {
    {"cpu",
     [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
       return OrFail(CreateCpuBackend(config, weights, dispatch));
     }},
        {"cpu_parallel",
         [](const ModelConfig& config, const ModelWeights& weights,
            const DispatchConfig& dispatch) {
           CpuBackendOptions options;
           options.num_threads = 2;
           options.parallel_attention_min_macs = 0;
           options.parallel_matmul_min_macs = 0;
           options.parallel_sampling_min_vocab = 0;
           return OrFail(CreateCpuBackend(config, weights, dispatch, options));
         }},
        CpuParallelBackend("cpu_generic", cpu::KernelIsa::kGeneric),
#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
        {"cuda_f32", CudaF32},
#endif
  };
  return *backends;
}

BackendUnderTest CpuParallelBackend(std::string name, cpu::KernelIsa isa) {
  return {std::move(name), [isa](const ModelConfig& config, const ModelWeights& weights,
                                 const DispatchConfig& dispatch) {
            CpuBackendOptions options;
            options.num_threads = 2;
            options.parallel_attention_min_macs = 0;
            options.parallel_matmul_min_macs = 0;
            options.parallel_sampling_min_vocab = 0;
            options.kernel_isa = isa;
            return OrFail(CreateCpuBackend(config, weights, dispatch, options));
          }};
}

BackendUnderTest CpuSamplingBackend(bool pool) {
  return {pool ? "cpu_pool_sampling" : "cpu_serial_sampling",
          [pool](const ModelConfig& config, const ModelWeights& weights,
                 const DispatchConfig& dispatch) {
            CpuBackendOptions options;
            options.num_threads = 2;
            options.parallel_sampling_min_vocab = pool ? 0 : std::numeric_limits<int>::max();
            return OrFail(CreateCpuBackend(config, weights, dispatch, options));
          }};
}

BackendUnderTest CpuBf16KvCacheBackend() {
  return {"cpu_bf16_kv", [](const ModelConfig& config, const ModelWeights& weights,
                            const DispatchConfig& dispatch) {
            CpuBackendOptions options;
            options.num_threads = 2;
            options.parallel_attention_min_macs = 0;
            options.parallel_matmul_min_macs = 0;
            options.parallel_sampling_min_vocab = 0;
            options.kv_cache_dtype = DType::kBF16;
            return OrFail(CreateCpuBackend(config, weights, dispatch, options));
          }};
}

std::vector<BackendUnderTest> EngineScaleBackendsUnderTest() {
  std::vector<BackendUnderTest> backends;
  for (const BackendUnderTest& backend : BackendsUnderTest()) {
#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
    if (CudaBackendIsEmulated() && backend.name.rfind("cuda", 0) == 0) continue;
#endif
    backends.push_back(backend);
  }
  return backends;
}

}  // namespace switchserve::testing
