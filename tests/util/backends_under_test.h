// Every backend this build can test, by name: the parameter of the
// per-backend suites (golden parity, the float64 reference, incremental ==
// full, batching, dispatch, sampling), in the spirit of ggml's
// test-backend-ops. A backend joins every one of those suites by adding
// itself to BackendsUnderTest() (backends_under_test.cc).
#ifndef SWITCHSERVE_TESTS_UTIL_BACKENDS_UNDER_TEST_H_
#define SWITCHSERVE_TESTS_UTIL_BACKENDS_UNDER_TEST_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/backend.h"
#include "kernels/cpu/kernel_isa.h"

namespace switchserve::testing {

using BackendFactory = std::function<std::unique_ptr<Backend>(
    const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch)>;

struct BackendUnderTest {
  std::string name;  // part of the test names: letters, digits, '_'
  BackendFactory create;
};
inline void PrintTo(const BackendUnderTest& backend, std::ostream* os) { *os << backend.name; }

// The CPU backend as it is created by default ("cpu"), with two threads
// sharing out every matmul group and attention however small the step
// ("cpu_parallel"), and the same on the portable build of its kernels
// ("cpu_generic"); then every other backend built: the CUDA backend in its
// f32 mode ("cuda_f32"), on the SIMT executor in CI (or on a GPU in the GPU
// suite).
const std::vector<BackendUnderTest>& BackendsUnderTest();

// The CPU backend as "cpu_parallel" is, on the `isa` build of its kernels,
// named `name`.
BackendUnderTest CpuParallelBackend(std::string name, cpu::KernelIsa isa);

// BackendsUnderTest() but the CUDA backend when it runs on the SIMT executor:
// for engine-level tests over the built-in model (hundreds of steps of 32
// requests), which the executor runs for around ten minutes each. The CUDA
// backend's isolation is checked bitwise on small models by
// tests/cuda/cuda_consistency_test.cc instead.
std::vector<BackendUnderTest> EngineScaleBackendsUnderTest();

// The CPU backend with its KV cache in bf16 ("cpu_bf16_kv"), two threads
// sharing out all work as in "cpu_parallel". Not one of BackendsUnderTest():
// rounding keys and values moves logits past the goldens' f32 tolerances; the
// isolation suites run it beside them, and kv_cache_dtype_test.cc bounds its
// distance from the f32 cache.
BackendUnderTest CpuBf16KvCacheBackend();

// The CPU backend on two threads, its own thresholds, its samples shared out
// over them (`pool`) or run on the step's thread whatever the vocabulary
// (CpuBackendOptions::parallel_sampling_min_vocab): for sampler_bench.
BackendUnderTest CpuSamplingBackend(bool pool);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_BACKENDS_UNDER_TEST_H_
