// Every backend against the naive float64 reference (tests/util/naive_reference.h)
// on every architecture variant: a long prefill (more than one query tile),
// decoding after it, and capacity dispatch replayed from the backend's trace.
#include <string>
#include <tuple>
#include <vector>

#include "engine/moe/routing_stats.h"
#include "gtest/gtest.h"
#include "tests/util/backend_harness.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/naive_reference.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::AllVariantConfigs;
using testing::BackendUnderTest;
using testing::ForcedRoutes;
using testing::NaiveLogits;
using testing::NamedConfig;
using testing::RandomTokens;
using testing::RandomWeights;
using testing::RelError;
using testing::Slice;
using Harness = testing::BackendHarness;

// Parameter: (backend, model variant).
class BackendReferenceTest
    : public ::testing::TestWithParam<std::tuple<BackendUnderTest, NamedConfig>> {
 protected:
  const BackendUnderTest& backend() const { return std::get<0>(GetParam()); }
  const ModelConfig& config() const { return std::get<1>(GetParam()).config; }
};

TEST_P(BackendReferenceTest, MatchesNaiveReference) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 13);
  // 70 tokens: more than one query tile of the GEMM attention.
  const std::vector<int32_t> tokens = RandomTokens(70, config.vocab_size, 51);
  Harness h(backend(), config, weights, config.dispatch);
  const std::vector<float> got = h.Run(1, tokens, 0);
  EXPECT_LE(RelError(got, NaiveLogits(config, weights, tokens)), 1e-4);
  // And decoding a few more tokens one by one after it.
  const std::vector<int32_t> more = RandomTokens(3, config.vocab_size, 52);
  std::vector<int32_t> all = tokens;
  all.insert(all.end(), more.begin(), more.end());
  const std::vector<float> want = NaiveLogits(config, weights, all);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> row = h.Run(1, {more[i]}, 70 + i);
    EXPECT_LE(RelError(row, Slice(want, 70 + i, config.vocab_size)), 1e-4) << "decode " << i;
  }
}

// Under capacity pressure (drop, reroute) the backend applies exactly the
// routing its trace reports: the reference replays the trace.
using BackendReferenceRoutedTest = BackendReferenceTest;

TEST_P(BackendReferenceRoutedTest, AppliesDispatchAsTraced) {
  const ModelConfig& config = this->config();
  ASSERT_FALSE(RouterLayout(config).empty());
  const ModelWeights weights = RandomWeights(config, 17);
  const std::vector<int32_t> tokens = RandomTokens(24, config.vocab_size, 61);
  for (OverflowPolicy policy : {OverflowPolicy::kDrop, OverflowPolicy::kReroute}) {
    for (CapacityScope scope : {CapacityScope::kStep, CapacityScope::kSequence}) {
      DispatchConfig dispatch;
      dispatch.capacity_factor = 0.6;
      dispatch.overflow = policy;
      dispatch.scope = scope;
      dispatch.capacity_group = 8;  // 3 groups in 24 tokens
      Harness h(backend(), config, weights, dispatch);
      StepOutput out;
      ASSERT_TRUE(h.Step({{1, tokens, 0, LogitsMode::kAll, true}}, &out).ok());
      // Pressure shows as drops, or as reroutes where another expert has room.
      int64_t overflowed = 0;
      for (const RouterStepStats& s : out.stats.routers) {
        for (int64_t v : s.dropped) overflowed += v;
        for (int64_t v : s.rerouted) overflowed += v;
      }
      EXPECT_GT(overflowed, 0) << ToString(policy) << " " << ToString(scope);
      const ForcedRoutes forced(config, out.routing);
      EXPECT_LE(RelError(out.logits, NaiveLogits(config, weights, tokens, &forced)), 1e-4)
          << ToString(policy) << " " << ToString(scope);
    }
  }
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<BackendUnderTest, NamedConfig>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}
INSTANTIATE_TEST_SUITE_P(Backends, BackendReferenceTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(AllVariantConfigs())),
                         TestName);
INSTANTIATE_TEST_SUITE_P(Backends, BackendReferenceRoutedTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::RoutedVariantConfigs())),
                         TestName);

}  // namespace
}  // namespace switchserve
