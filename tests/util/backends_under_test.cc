#include "tests/util/backends_under_test.h"

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

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

}  // namespace

const std::vector<BackendUnderTest>& BackendsUnderTest() {
  static const std::vector<BackendUnderTest>* const backends = new std::vector<BackendUnderTest>{
      {"cpu",
       [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
         return OrFail(CreateCpuBackend(config, weights, dispatch));
       }},
      {"cpu_parallel",
       [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
         CpuBackendOptions options;
         options.num_threads = 2;
         options.parallel_attention_min_macs = 0;
         options.parallel_matmul_min_macs = 0;
         return OrFail(CreateCpuBackend(config, weights, dispatch, options));
       }},
      {"cpu_generic",
       [](const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch) {
         CpuBackendOptions options;
         options.num_threads = 2;
         options.parallel_attention_min_macs = 0;
         options.parallel_matmul_min_macs = 0;
         options.generic_kernels = true;
         return OrFail(CreateCpuBackend(config, weights, dispatch, options));
       }},
  };
  return *backends;
}

}  // namespace switchserve::testing
