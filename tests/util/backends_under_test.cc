#include "tests/util/backends_under_test.h"

#include "kernels/cpu/cpu_backend.h"

namespace switchserve::testing {

const std::vector<BackendUnderTest>& BackendsUnderTest() {
  static const std::vector<BackendUnderTest>* const backends = new std::vector<BackendUnderTest>{
      {"cpu",
       [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
         return CreateCpuBackend(config, weights, dispatch);
       }},
      {"cpu_parallel",
       [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
         CpuBackendOptions options;
         options.num_threads = 2;
         options.parallel_attention_min_macs = 0;
         options.parallel_matmul_min_macs = 0;
         return CreateCpuBackend(config, weights, dispatch, options);
       }},
      {"cpu_generic",
       [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
         CpuBackendOptions options;
         options.num_threads = 2;
         options.parallel_attention_min_macs = 0;
         options.parallel_matmul_min_macs = 0;
         options.generic_kernels = true;
         return CreateCpuBackend(config, weights, dispatch, options);
       }},
  };
  return *backends;
}

}  // namespace switchserve::testing
