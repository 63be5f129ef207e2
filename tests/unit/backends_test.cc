#include "kernels/backends.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "tests/util/random_model.h"

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
      ASSERT_TRUE(backend.ok()) << ToString(device) << ": " << backend.status();
      // The backend names its own device (what logs and GetModelInfo report).
      EXPECT_EQ((*backend)->name(), ToString(device));
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

}  // namespace
}  // namespace switchserve
