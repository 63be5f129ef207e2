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
// ("cpu_generic"); then every other backend built.
const std::vector<BackendUnderTest>& BackendsUnderTest();

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_BACKENDS_UNDER_TEST_H_
