// Helpers of the CUDA backend's own tests (tests/cuda): the backend with
// given options as a BackendUnderTest, the CPU backend beside it, and
// bitwise comparison of step outputs.
#ifndef SWITCHSERVE_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define SWITCHSERVE_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <string>
#include <vector>

#include "engine/runtime/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/util/backends_under_test.h"

namespace switchserve::testing {

// The CUDA backend created with `options` (a test failure when it cannot be).
BackendUnderTest CudaBackendWith(const CudaBackendOptions& options, const std::string& name);
// f32 weights, short attention segments (as in BackendsUnderTest()).
CudaBackendOptions CudaF32Options();
// 16-bit weights (the default format), short attention segments.
CudaBackendOptions Cuda16BitOptions();
// The CPU backend, as created by default.
BackendUnderTest CpuBackend();

// Everything a step returned, as bytes: equal strings mean bitwise-equal
// logits, samples (tokens, logprobs, alternatives), statistics and routing.
std::string OutputBytes(const StepOutput& out);
// The bytes of `n` floats from `v[first]` on.
std::string FloatBytes(const std::vector<float>& v, size_t first, size_t n);

// sqrt(sum (a - b)^2 / sum b^2).
double RelativeRms(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_CUDA_CUDA_TEST_UTIL_H_
