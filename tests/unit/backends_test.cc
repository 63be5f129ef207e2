#include "kernels/backends.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/util/random_model.h"
#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace switchserve {
namespace {

TEST(BackendsTest, DeviceNamesRoundTrip) {
  for (DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kAuto}) {
    auto parsed = ParseDeviceKind(ToString(device));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, device);
  }
  EXPECT_EQ(ParseDeviceKind("gpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDeviceKind("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendsTest, CreatesEveryBuiltDeviceAndRefusesOthers) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = testing::RandomWeights(config, 1);
  const std::vector<DeviceKind> built = BuiltDevices();
  ASSERT_FALSE(built.empty());
  EXPECT_NE(std::find(built.begin(), built.end(), DeviceKind::kCpu), built.end());
  EXPECT_EQ(std::find(built.begin(), built.end(), DeviceKind::kAuto), built.end());
  for (DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    auto backend = CreateBackend(device, config, weights, config.dispatch);
    if (std::find(built.begin(), built.end(), device) != built.end()) {
      if (!backend.ok() && backend.status().code() == absl::StatusCode::kFailedPrecondition &&
          device == DeviceKind::kCuda) {
        // A GPU build on a machine without a usable GPU says so.
        EXPECT_TRUE(
            absl::StrContains(std::string(backend.status().message()), "no usable CUDA device"))
            << backend.status();
        continue;
      }
      ASSERT_TRUE(backend.ok()) << ToString(device) << ": " << backend.status();
      // The backend names its own device (what logs and GetModelInfo report);
      // the CUDA backend on the SIMT executor says "cuda (emulated)".
      const std::string name((*backend)->name());
      EXPECT_TRUE(absl::StartsWith(name, std::string(ToString(device)))) << name;
    } else {
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  auto automatic = CreateBackend(DeviceKind::kAuto, config, weights, config.dispatch);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_NE(std::find_if(built.begin(), built.end(),
                         [&](DeviceKind d) { return ToString(d) == (*automatic)->name(); }),
            built.end());
}

#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
// The CUDA backend on the SIMT executor is for tests: built and created by
// name, named as emulated, never chosen by `auto`.
TEST(BackendsTest, EmulatedCudaRunsOnlyWhenAskedFor) {
  if (!CudaBackendIsEmulated()) GTEST_SKIP() << "this build's CUDA backend runs on a GPU";
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = testing::RandomWeights(config, 1);
  auto cuda = CreateBackend(DeviceKind::kCuda, config, weights, config.dispatch);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ((*cuda)->name(), "cuda (emulated)");
  std::vector<std::string> warnings;
  auto automatic = CreateBackend(DeviceKind::kAuto, config, weights, config.dispatch,
                                 BackendOptions{.warnings = &warnings});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ((*automatic)->name(), "cpu");
  // What `auto` passed over, and why, for the server's log.
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "--device auto: passed over cuda (the CUDA backend on the SIMT executor runs only "
            "when asked for); the cpu backend runs instead");
}

// --allow-non-finite-weights reaches the CUDA backend: a finite f32 weight
// that its 16-bit matrices make infinite is refused, naming the tensor and
// the flag, or, allowed, held with a warning.
TEST(BackendsTest, CudaHoldsWeightsBeyondBf16OnlyWhenNonFiniteWeightsAreAllowed) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  ModelWeights weights = testing::RandomWeights(config, 1);
  weights.embedding.mutable_f32()[3] = 3.4e38f;
  std::vector<std::string> warnings;
  auto refused = CreateBackend(DeviceKind::kCuda, config, weights, config.dispatch,
                               BackendOptions{.warnings = &warnings});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "tensor embedding.weight "))
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--allow-non-finite-weights"))
      << refused.status();
  EXPECT_TRUE(warnings.empty());
  auto allowed =
      CreateBackend(DeviceKind::kCuda, config, weights, config.dispatch,
                    BackendOptions{.allow_non_finite_weights = true, .warnings = &warnings});
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(warnings[0], "tensor embedding.weight holds non-finite values"))
      << warnings[0];
}
#endif

}  // namespace
}  // namespace switchserve
