// The CUDA backend's routing against the CPU backend's on the same model and
// step: every router's choices and fates and every count bit-identical, gates
// and probability sums to f32 rounding, for drop, reroute and dropless, in
// the step and the sequence capacity scopes (with capacity groups continued
// from one step to the next); with
// exact ties between experts (duplicated router rows, all-zero routers) the
// tie-breaking too. And replay: the CUDA backend forced to the CPU's choices
// gives the CPU's logits.
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/util/backend_harness.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::BackendHarness;
using testing::NamedConfig;
using testing::RandomTokens;
using testing::RandomWeights;

DispatchConfig Dispatch(double capacity_factor, OverflowPolicy overflow,
                        CapacityScope scope = CapacityScope::kStep, int group = 0) {
  DispatchConfig d;
  d.capacity_factor = capacity_factor;
  d.overflow = overflow;
  d.scope = scope;
  if (group > 0) d.capacity_group = group;
  return d;
}

// Two steps of two sequences (9 and 7 tokens: 6 and 3 of them, then the
// rest), every row returned with its routing, on `backend`.
std::vector<StepOutput> RunSteps(const testing::BackendUnderTest& backend,
                                 const ModelConfig& config, const ModelWeights& weights,
                                 const DispatchConfig& dispatch) {
  BackendHarness h(backend, config, weights, dispatch);
  std::vector<StepOutput> out(2);
  const auto a = RandomTokens(9, config.vocab_size, 201);
  const auto b = RandomTokens(7, config.vocab_size, 202);
  using Tokens = std::vector<int32_t>;
  EXPECT_TRUE(h.Step({{1, Tokens(a.begin(), a.begin() + 6), 0, LogitsMode::kAll, true},
                      {2, Tokens(b.begin(), b.begin() + 3), 0, LogitsMode::kAll, true}},
                     &out[0])
                  .ok());
  EXPECT_TRUE(h.Step({{1, Tokens(a.begin() + 6, a.end()), 6, LogitsMode::kAll, true},
                      {2, Tokens(b.begin() + 3, b.end()), 3, LogitsMode::kAll, true}},
                     &out[1])
                  .ok());
  return out;
}

void ExpectSameRouting(const StepOutput& cuda, const StepOutput& cpu);

void ExpectSameRouting(const std::vector<StepOutput>& cuda, const std::vector<StepOutput>& cpu) {
  ASSERT_EQ(cuda.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i);
    ExpectSameRouting(cuda[i], cpu[i]);
  }
}

void ExpectSameRouting(const StepOutput& cuda, const StepOutput& cpu) {
  ASSERT_EQ(cuda.routing.size(), cpu.routing.size());
  for (size_t t = 0; t < cpu.routing.size(); ++t) {
    const std::vector<RouteChoice>& got = cuda.routing[t].choices;
    const std::vector<RouteChoice>& want = cpu.routing[t].choices;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].expert, want[i].expert) << "token " << t << " choice " << i;
      ASSERT_EQ(got[i].fate, want[i].fate) << "token " << t << " choice " << i;
      ASSERT_NEAR(got[i].gate, want[i].gate, 1e-5) << "token " << t << " choice " << i;
    }
  }
  ASSERT_EQ(cuda.stats.routers.size(), cpu.stats.routers.size());
  for (size_t r = 0; r < cpu.stats.routers.size(); ++r) {
    const RouterStepStats& got = cuda.stats.routers[r];
    const RouterStepStats& want = cpu.stats.routers[r];
    EXPECT_EQ(got.tokens, want.tokens) << "router " << r;
    EXPECT_EQ(got.routed, want.routed) << "router " << r;
    EXPECT_EQ(got.kept, want.kept) << "router " << r;
    EXPECT_EQ(got.rerouted, want.rerouted) << "router " << r;
    EXPECT_EQ(got.dropped, want.dropped) << "router " << r;
    for (size_t e = 0; e < want.prob_sum.size(); ++e) {
      EXPECT_NEAR(got.prob_sum[e], want.prob_sum[e], 1e-5 * (1 + want.prob_sum[e])) << r;
    }
  }
  EXPECT_LE(testing::RelError(cuda.logits, cpu.logits), 1e-4);
}

// Parameter: (routed variant, policy).
class CudaRoutingTest : public ::testing::TestWithParam<std::tuple<NamedConfig, int>> {
 protected:
  const ModelConfig& config() const { return std::get<0>(GetParam()).config; }
  DispatchConfig dispatch() const {
    switch (std::get<1>(GetParam())) {
      case 0:
        return Dispatch(0.0, OverflowPolicy::kDrop);
      case 1:
        return Dispatch(0.5, OverflowPolicy::kDrop);
      case 2:
        return Dispatch(0.5, OverflowPolicy::kReroute);
      case 3:
        return Dispatch(1.0, OverflowPolicy::kReroute);
      case 4:
        return Dispatch(0.5, OverflowPolicy::kDrop, CapacityScope::kSequence, 4);
      case 5:
        return Dispatch(0.5, OverflowPolicy::kReroute, CapacityScope::kSequence, 4);
      default:
        return Dispatch(1.0, OverflowPolicy::kReroute, CapacityScope::kSequence, 5);
    }
  }
};

TEST_P(CudaRoutingTest, RoutingIsTheCpuBackends) {
  const ModelWeights weights = RandomWeights(config(), 203);
  const auto cuda = testing::CudaBackendWith(testing::CudaF32Options(), "cuda");
  const std::vector<StepOutput> got = RunSteps(cuda, config(), weights, dispatch());
  const std::vector<StepOutput> want =
      RunSteps(testing::CpuBackend(), config(), weights, dispatch());
  ExpectSameRouting(got, want);
}

// Routers whose rows repeat (expert 1 = expert 0, expert 3 = expert 2, ...)
// give exactly equal logits on both backends: ties, broken to the lower
// expert, in top-k and in reroute; all-zero routers tie every expert.
TEST_P(CudaRoutingTest, TiesBreakAsOnTheCpu) {
  for (const bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "all-zero routers" : "paired router rows");
    ModelWeights weights = RandomWeights(config(), 204);
    const int d = config().d_model;
    auto tie = [&](Tensor& t) {
      if (t.empty()) return;
      const int64_t rows = static_cast<int64_t>(static_cast<size_t>(t.size())) / d;
      for (int64_t r = 0; r < rows; ++r) {
        float* row = t.mutable_f32() + r * d;
        for (int i = 0; i < d; ++i) {
          row[i] = zero ? 0.0f : (r % 2 == 1 ? row[i - d] : row[i]);
        }
      }
    };
    for (LayerWeights& layer : weights.layers) {
      tie(layer.attn.sel_v);
      tie(layer.attn.sel_o);
      tie(layer.ffn.router_w);
      if (!layer.ffn.router_b.empty()) {
        for (size_t e = 0; e < static_cast<size_t>(layer.ffn.router_b.size()); ++e) {
          layer.ffn.router_b.mutable_f32()[e] =
              zero ? 0.0f : layer.ffn.router_b.mutable_f32()[e & ~size_t{1}];
        }
      }
    }
    const auto cuda = testing::CudaBackendWith(testing::CudaF32Options(), "cuda");
    const std::vector<StepOutput> got = RunSteps(cuda, config(), weights, dispatch());
    const std::vector<StepOutput> want =
        RunSteps(testing::CpuBackend(), config(), weights, dispatch());
    ExpectSameRouting(got, want);
  }
}

std::string TestName(const ::testing::TestParamInfo<std::tuple<NamedConfig, int>>& info) {
  static const char* const kPolicies[] = {"dropless",          "drop",        "reroute",
                                          "reroute_cf1",       "seq_drop_g4", "seq_reroute_g4",
                                          "seq_reroute_cf1_g5"};
  return std::get<0>(info.param).name + "_" + kPolicies[std::get<1>(info.param)];
}
INSTANTIATE_TEST_SUITE_P(Variants, CudaRoutingTest,
                         ::testing::Combine(::testing::ValuesIn(testing::RoutedVariantConfigs()),
                                            ::testing::Range(0, 7)),
                         TestName);

}  // namespace
}  // namespace switchserve
