// The dispatch overrides shared by serve, generate and score
// (server/dispatch_flags.h): parsing, the rules of capacity_group, applying
// them to a model's dispatch, and the startup warning of the step scope.
#include "server/dispatch_flags.h"

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchserve {
namespace {

using ::testing::HasSubstr;

class DispatchFlagsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    absl::SetFlag(&FLAGS_capacity_factor, std::nullopt);
    absl::SetFlag(&FLAGS_overflow, "");
    absl::SetFlag(&FLAGS_min_capacity, std::nullopt);
    absl::SetFlag(&FLAGS_capacity_scope, "");
    absl::SetFlag(&FLAGS_capacity_group, std::nullopt);
  }
};

TEST_F(DispatchFlagsTest, UnsetFlagsKeepTheModelsDispatch) {
  absl::StatusOr<DispatchOverrides> overrides = DispatchOverridesFromFlags();
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  DispatchConfig model;
  model.capacity_factor = 2.0;
  model.min_capacity = 4;
  model.scope = CapacityScope::kSequence;
  model.capacity_group = 64;
  absl::StatusOr<DispatchConfig> applied = ApplyDispatchOverrides(model, *overrides);
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(applied->capacity_factor, 2.0);
  EXPECT_EQ(applied->min_capacity, 4);
  EXPECT_EQ(applied->scope, CapacityScope::kSequence);
  EXPECT_EQ(applied->capacity_group, 64);
}

TEST_F(DispatchFlagsTest, FlagsOverrideEveryKey) {
  absl::SetFlag(&FLAGS_capacity_factor, 1.5);
  absl::SetFlag(&FLAGS_overflow, "reroute");
  absl::SetFlag(&FLAGS_min_capacity, 2);
  absl::SetFlag(&FLAGS_capacity_scope, "sequence");
  absl::SetFlag(&FLAGS_capacity_group, 16);
  absl::StatusOr<DispatchOverrides> overrides = DispatchOverridesFromFlags();
  ASSERT_TRUE(overrides.ok()) << overrides.status();
  DispatchConfig model;
  model.scope = CapacityScope::kStep;
  absl::StatusOr<DispatchConfig> applied = ApplyDispatchOverrides(model, *overrides);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->capacity_factor, 1.5);
  EXPECT_EQ(applied->overflow, OverflowPolicy::kReroute);
  EXPECT_EQ(applied->min_capacity, 2);
  EXPECT_EQ(applied->scope, CapacityScope::kSequence);
  EXPECT_EQ(applied->capacity_group, 16);
  EXPECT_EQ(DescribeDispatch(*applied),
            "capacity_factor 1.5 (sequence scope, capacity_group 16), min_capacity 2, overflow "
            "reroute");
}

TEST_F(DispatchFlagsTest, BadValuesNameTheFlag) {
  absl::SetFlag(&FLAGS_capacity_scope, "batch");
  EXPECT_THAT(DispatchOverridesFromFlags().status().message(),
              HasSubstr("--capacity-scope: capacity scope: expected \"sequence\" or \"step\""));
  absl::SetFlag(&FLAGS_capacity_scope, "");
  absl::SetFlag(&FLAGS_capacity_group, 0);
  EXPECT_THAT(DispatchOverridesFromFlags().status().message(),
              HasSubstr("--capacity-group: must be >= 1"));
  absl::SetFlag(&FLAGS_capacity_group, 8);
  absl::SetFlag(&FLAGS_capacity_scope, "step");
  EXPECT_THAT(DispatchOverridesFromFlags().status().message(),
              HasSubstr("--capacity-group: applies to --capacity-scope sequence only"));
  absl::SetFlag(&FLAGS_capacity_group, std::nullopt);
  absl::SetFlag(&FLAGS_min_capacity, -1);
  EXPECT_THAT(DispatchOverridesFromFlags().status().message(),
              HasSubstr("--min-capacity: must be >= 0"));
}

// A group for a model whose dispatch is the step scope, without switching
// the scope, is refused when applied.
TEST_F(DispatchFlagsTest, GroupForAStepScopeModelIsRefused) {
  absl::SetFlag(&FLAGS_capacity_group, 32);
  absl::StatusOr<DispatchOverrides> overrides = DispatchOverridesFromFlags();
  ASSERT_TRUE(overrides.ok());
  DispatchConfig model;
  model.scope = CapacityScope::kStep;
  absl::StatusOr<DispatchConfig> applied = ApplyDispatchOverrides(model, *overrides);
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(applied.status().message(), HasSubstr("--capacity-group"));
  EXPECT_THAT(applied.status().message(), HasSubstr("\"step\""));
}

TEST_F(DispatchFlagsTest, OnlyTheStepScopeWithACapacityWarns) {
  DispatchConfig dispatch;
  dispatch.capacity_factor = 1.25;
  EXPECT_EQ(SharedCapacityWarning(dispatch), "");
  dispatch.scope = CapacityScope::kStep;
  EXPECT_THAT(SharedCapacityWarning(dispatch), HasSubstr("capacity_scope \"step\""));
  EXPECT_THAT(SharedCapacityWarning(dispatch), HasSubstr("arXiv:2402.05526"));
  dispatch.capacity_factor = 0;  // dropless: nothing is shared
  EXPECT_EQ(SharedCapacityWarning(dispatch), "");
}

}  // namespace
}  // namespace switchserve
