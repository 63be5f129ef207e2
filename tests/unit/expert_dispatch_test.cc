#include "engine/moe/expert_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/ranked_logits.h"

namespace switchserve {
namespace {

using testing::RankedLogits;

// Step scope (the sequence scope has its own tests: sequence_dispatch_test.cc).
DispatchConfig Capacity(double factor, int min_capacity, OverflowPolicy overflow) {
  DispatchConfig d;
  d.capacity_factor = factor;
  d.min_capacity = min_capacity;
  d.overflow = overflow;
  d.scope = CapacityScope::kStep;
  return d;
}

// One router's step: tokens ranking the experts in the listed order
// (RankedLogits), routed to their top `top_k` by sigmoid gates and dispatched
// under `dispatch`.
struct DispatchedStep {
  RouterDecision decision;
  ExpertAssignments assignments;
  RouterStepStats stats;
};
DispatchedStep RouteAndDispatch(const std::vector<std::vector<int>>& order, int n_experts,
                                int top_k, const DispatchConfig& dispatch) {
  const std::vector<float> z = RankedLogits(order, n_experts);
  DispatchedStep step;
  RouteTokens(z.data(), n_experts, static_cast<int>(order.size()), n_experts, top_k,
              GateFunction::kSigmoid, false, &step.decision);
  step.stats.Reset(n_experts);
  DispatchTokens(step.decision, dispatch, nullptr, &step.assignments, &step.stats);
  return step;
}

TEST(ExpertDispatchTest, CapacityFormula) {
  EXPECT_EQ(Capacity(1.0, 0, OverflowPolicy::kDrop).CapacityPerExpert(10, 1, 4), 3);
  EXPECT_EQ(Capacity(1.25, 0, OverflowPolicy::kDrop).CapacityPerExpert(16, 2, 8), 5);
  EXPECT_EQ(Capacity(1.0, 4, OverflowPolicy::kDrop).CapacityPerExpert(10, 1, 4), 4);
}

TEST(ExpertDispatchTest, TopKSigmoidWeightsAndTiesToLowerIndex) {
  const std::vector<float> z = {0.5f, 0.5f, 0.5f, -1.0f, 2.0f, 0.0f, 2.0f, 1.0f};
  RouterDecision d;
  RouteTokens(z.data(), 4, 2, 4, 2, GateFunction::kSigmoid, false, &d);
  EXPECT_EQ(d.expert[0], 0);
  EXPECT_EQ(d.expert[1], 1);
  EXPECT_EQ(d.expert[2], 0);  // tie between experts 0 and 2 of token 1
  EXPECT_EQ(d.expert[3], 2);
  EXPECT_FLOAT_EQ(d.weight[2], 1.0f / (1.0f + std::exp(-2.0f)));
  // Statistics probabilities: sigmoids divided by their sum.
  double sum = 0;
  for (int e = 0; e < 4; ++e) sum += 1.0 / (1.0 + std::exp(-z[4 + e]));
  EXPECT_NEAR(d.prob[4], 1.0 / (1.0 + std::exp(-2.0)) / sum, 1e-6);
}

// The top k by repeated scans: each rank takes the first expert not yet
// chosen, then any later one with a strictly higher logit (a NaN is never
// higher, nor is anything higher than a NaN).
std::vector<int32_t> ScannedTopK(const float* z, int n_experts, int top_k) {
  std::vector<int32_t> chosen;
  for (int r = 0; r < top_k; ++r) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e) {
      if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
      if (best < 0 || z[e] > z[best]) best = e;
    }
    chosen.push_back(best);
  }
  return chosen;
}

TEST(ExpertDispatchTest, TopKMatchesRepeatedScansWithTiesInfinitiesAndNaNs) {
  // Logits from a few values, so that most rows hold ties; some rows hold
  // infinities and NaNs, at every position.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values = {-1.0f, 0.0f, 0.0f, 0.5f, 2.0f, 2.0f, -inf, inf, nan};
  std::mt19937 rng(11);
  for (const auto& [n_experts, top_k] : std::vector<std::pair<int, int>>{
           {4, 1}, {4, 2}, {4, 4}, {8, 3}, {16, 4}, {32, 4}, {32, 8}}) {
    const int tokens = 400;
    std::vector<float> z(static_cast<size_t>(tokens) * n_experts);
    for (int t = 0; t < tokens; ++t) {
      // Every fourth row without the NaN and the infinities.
      const int choices = t % 4 == 0 ? 6 : static_cast<int>(values.size());
      for (int e = 0; e < n_experts; ++e) z[t * n_experts + e] = values[rng() % choices];
    }
    RouterDecision d;
    RouteTokens(z.data(), n_experts, tokens, n_experts, top_k, GateFunction::kSigmoid, false, &d);
    for (int t = 0; t < tokens; ++t) {
      const std::vector<int32_t> want = ScannedTopK(z.data() + t * n_experts, n_experts, top_k);
      const std::vector<int32_t> got(d.expert.begin() + t * top_k,
                                     d.expert.begin() + (t + 1) * top_k);
      ASSERT_EQ(got, want) << "E " << n_experts << " k " << top_k << " token " << t;
    }
  }
}

// A step's rows routed in ranges, last range first, into one sized decision
// (as the CPU backend shares them out on its threads) give RouteTokens's
// decision bit for bit, for every gate, with and without renormalizing: each
// row reads its own logits (row stride ld past the router's columns) and
// writes its own rows of the decision.
TEST(ExpertDispatchTest, RowsRoutedInRangesGiveTheWholeStepsDecision) {
  constexpr int kTokens = 37, kExperts = 6, kTopK = 2, kLd = 9;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kTokens * kLd);
  for (float& z : logits) z = normal(rng);
  const auto same_bits = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(), [](auto a, auto b) {
             return std::memcmp(&a, &b, sizeof(a)) == 0;
           });
  };
  for (const GateFunction gate :
       {GateFunction::kSigmoid, GateFunction::kSoftmax, GateFunction::kSoftmaxTopK}) {
    for (const bool renormalize : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "gate " << static_cast<int>(gate) << " renormalize " << renormalize);
      RouterDecision whole, ranges;
      RouteTokens(logits.data(), kLd, kTokens, kExperts, kTopK, gate, renormalize, &whole);
      SizeRouterDecision(kTokens, kExperts, kTopK, &ranges);
      for (const auto& [begin, end] : {std::pair{25, 37}, std::pair{1, 25}, std::pair{0, 1}}) {
        RouteTokenRows(logits.data(), kLd, begin, end, gate, renormalize, &ranges);
      }
      EXPECT_EQ(ranges.tokens, kTokens);
      EXPECT_TRUE(same_bits(whole.score, ranges.score));
      EXPECT_TRUE(same_bits(whole.gate_value, ranges.gate_value));
      EXPECT_TRUE(same_bits(whole.prob, ranges.prob));
      EXPECT_TRUE(same_bits(whole.expert, ranges.expert));
      EXPECT_TRUE(same_bits(whole.weight, ranges.weight));
    }
  }
}

TEST(ExpertDispatchTest, RanksByLogitNotBySaturatedGate) {
  // sigmoid(20) and sigmoid(30) are both 1.0f: the logit still decides.
  const std::vector<float> z = {20.0f, 30.0f, -1.0f};
  RouterDecision d;
  RouteTokens(z.data(), 3, 1, 3, 1, GateFunction::kSigmoid, false, &d);
  EXPECT_EQ(d.expert[0], 1);
  EXPECT_EQ(d.weight[0], 1.0f);
}

TEST(ExpertDispatchTest, SoftmaxTopKAndRenormalize) {
  const std::vector<float> z = {1.0f, 3.0f, 2.0f};
  RouterDecision d;
  RouteTokens(z.data(), 3, 1, 3, 2, GateFunction::kSoftmaxTopK, false, &d);
  EXPECT_EQ(d.expert[0], 1);
  EXPECT_EQ(d.expert[1], 2);
  const double e1 = std::exp(1.0);
  EXPECT_NEAR(d.weight[0], e1 / (e1 + 1.0), 1e-6);
  EXPECT_NEAR(d.weight[1], 1.0 / (e1 + 1.0), 1e-6);
  // Statistics use the softmax over all E logits.
  const double all = std::exp(1.0) + std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(d.prob[1], std::exp(3.0) / all, 1e-6);

  RouteTokens(z.data(), 3, 1, 3, 2, GateFunction::kSoftmax, false, &d);
  EXPECT_NEAR(d.weight[0], std::exp(3.0) / all, 1e-6);
  RouteTokens(z.data(), 3, 1, 3, 2, GateFunction::kSoftmax, true, &d);
  EXPECT_NEAR(d.weight[0], e1 / (e1 + 1.0), 1e-6);
  EXPECT_NEAR(d.weight[0] + d.weight[1], 1.0, 1e-6);
}

// Three tokens, three experts, two choices each, one slot per expert.
TEST(ExpertDispatchTest, RankMajorSecondChoiceCannotStealFirstChoice) {
  const auto [d, a, stats] = RouteAndDispatch({{0, 1, 2}, {1, 2, 0}, {2, 0, 1}}, 3, 2,
                                              Capacity(0.5, 0, OverflowPolicy::kDrop));
  EXPECT_EQ(a.capacity, 1);
  for (int e = 0; e < 3; ++e) {
    ASSERT_EQ(a.count(e), 1);
    EXPECT_EQ(a.token[a.begin(e)], e);  // token e's first choice is expert e
  }
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(a.trace[t * 2].fate, RouteFate::kKept);
    EXPECT_EQ(a.trace[t * 2 + 1].fate, RouteFate::kDropped);
    EXPECT_EQ(a.trace[t * 2 + 1].gate, d.weight[t * 2 + 1]);  // would-be weight
  }
  EXPECT_EQ(stats.tokens, 3);
  EXPECT_EQ(stats.routed, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(stats.kept, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(stats.dropped, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(stats.rerouted, (std::vector<int64_t>{0, 0, 0}));
}

TEST(ExpertDispatchTest, DropKeepsFirstComersInStepOrder) {
  // Four tokens all prefer expert 1; C = max(2, ceil(0.5*4/2)) = 2.
  const auto [d, a, stats] = RouteAndDispatch({{1, 0}, {1, 0}, {1, 0}, {1, 0}}, 2, 1,
                                              Capacity(0.5, 2, OverflowPolicy::kDrop));
  EXPECT_EQ(a.capacity, 2);
  ASSERT_EQ(a.count(1), 2);
  EXPECT_EQ(a.token[a.begin(1)], 0);
  EXPECT_EQ(a.token[a.begin(1) + 1], 1);
  EXPECT_EQ(a.count(0), 0);
  EXPECT_EQ(a.trace[2].fate, RouteFate::kDropped);
  EXPECT_EQ(a.trace[3].fate, RouteFate::kDropped);
}

TEST(ExpertDispatchTest, RerouteToNextBestFreeExpertKeepsWeight) {
  // Four experts, one slot each. Second choices: token 0 wants 1 (full) ->
  // next best unchosen by gate score is 3 (score order 0,1,3,2 but 2 is full
  // anyway); token 1 wants 2 (full) -> 0 and 3 are left, both full -> dropped.
  const auto [d, a, stats] = RouteAndDispatch({{0, 1, 3, 2}, {1, 2, 0, 3}, {2, 0, 3, 1}}, 4, 2,
                                              Capacity(0.5, 1, OverflowPolicy::kReroute));
  ASSERT_EQ(a.capacity, 1);
  EXPECT_EQ(a.trace[1].fate, RouteFate::kRerouted);
  EXPECT_EQ(a.trace[1].expert, 3);
  EXPECT_FLOAT_EQ(a.trace[1].gate, d.weight[1]);  // the weight of the replaced choice
  ASSERT_EQ(a.count(3), 1);
  EXPECT_EQ(a.token[a.begin(3)], 0);
  EXPECT_FLOAT_EQ(a.weight[a.begin(3)], d.weight[1]);
  EXPECT_EQ(a.trace[3].fate, RouteFate::kDropped);  // no free expert
  EXPECT_EQ(a.trace[5].fate, RouteFate::kDropped);
  EXPECT_EQ(stats.rerouted, (std::vector<int64_t>{0, 1, 0, 0}));
  EXPECT_EQ(stats.kept, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(stats.dropped, (std::vector<int64_t>{1, 0, 1, 0}));
  for (int e = 0; e < 4; ++e) {
    const int64_t rerouted_in = e == 3 ? 1 : 0;
    EXPECT_EQ(stats.routed[e], stats.kept[e] - rerouted_in + stats.rerouted[e] + stats.dropped[e]);
  }
}

TEST(ExpertDispatchTest, RerouteSkipsExpertsTheTokenAlreadyChose) {
  // Three experts, one slot each (C = max(1, ceil(0.5*2*2/3)) = 1).
  // Rank 0: token 0 takes expert 0; token 1's first choice (0) is full and
  // must not move to expert 2, its own second choice: it goes to 1.
  // Rank 1: token 0's choice 1 is now full -> 2, the only expert it has not
  // chosen, is free. Token 1's choice 2 is then full and token 1 has chosen
  // every expert -> dropped.
  const auto [d, a, stats] =
      RouteAndDispatch({{0, 1, 2}, {0, 2, 1}}, 3, 2, Capacity(0.5, 1, OverflowPolicy::kReroute));
  ASSERT_EQ(a.capacity, 1);
  EXPECT_EQ(a.trace[0].fate, RouteFate::kKept);
  EXPECT_EQ(a.trace[2].fate, RouteFate::kRerouted);
  EXPECT_EQ(a.trace[2].expert, 1);
  EXPECT_EQ(a.trace[1].fate, RouteFate::kRerouted);
  EXPECT_EQ(a.trace[1].expert, 2);
  EXPECT_EQ(a.trace[3].fate, RouteFate::kDropped);
}

// A token is never rerouted twice to the same expert, even when that expert
// still has room after the first move.
TEST(ExpertDispatchTest, RerouteNeverMovesATokenTwiceToTheSameExpert) {
  // Four experts, two slots each (min_capacity 2). Rank 0: tokens 0 and 1
  // fill expert 0; token 2's choice 0 moves to 2, its best unchosen free
  // expert (2 then holds one of its two slots). Rank 1: tokens 0 and 1 fill
  // expert 1; token 2's choice 1 must not move to 2 again: it goes to 3.
  const auto [d, a, stats] = RouteAndDispatch({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}, 4, 2,
                                              Capacity(0.01, 2, OverflowPolicy::kReroute));
  ASSERT_EQ(a.capacity, 2);
  EXPECT_EQ(a.trace[4].fate, RouteFate::kRerouted);
  EXPECT_EQ(a.trace[4].expert, 2);
  EXPECT_EQ(a.trace[5].fate, RouteFate::kRerouted);
  EXPECT_EQ(a.trace[5].expert, 3);
  EXPECT_EQ(a.count(2), 1);
  EXPECT_EQ(a.count(3), 1);
}

TEST(ExpertDispatchTest, DroplessKeepsEverything) {
  const auto [d, a, stats] = RouteAndDispatch({{1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}}, 2, 2,
                                              Capacity(0.0, 1, OverflowPolicy::kDrop));
  EXPECT_EQ(a.count(0), 5);
  EXPECT_EQ(a.count(1), 5);
  EXPECT_EQ(stats.kept, (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(stats.dropped, (std::vector<int64_t>{0, 0}));
}

// A capacity factor whose slots leave int64 means room for everything: it
// saturates instead of wrapping to a negative count (which min_capacity then
// replaced, dropping more than a factor of 1.25 does).
// In both capacity scopes: the slots of a step (step) and of a group
// (sequence) saturate instead of leaving int64, and everything is kept.
TEST(ExpertDispatchTest, HugeCapacityFactorSaturatesAndKeepsEverything) {
  for (CapacityScope scope : {CapacityScope::kStep, CapacityScope::kSequence}) {
    for (double factor : {1e18, 1e300, std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN()}) {
      DispatchConfig dispatch = Capacity(factor, 1, OverflowPolicy::kDrop);
      dispatch.scope = scope;
      dispatch.capacity_group = std::numeric_limits<int>::max();
      EXPECT_EQ(dispatch.CapacityPerExpert(1 << 20, 4, 2), DispatchConfig::kMaxCapacity) << factor;
      EXPECT_EQ(dispatch.SlotsPerExpert(1 << 20, 4, 2), DispatchConfig::kMaxCapacity) << factor;
    }
    DispatchConfig dispatch = Capacity(1e300, 1, OverflowPolicy::kDrop);
    dispatch.scope = scope;
    const auto [d, a, stats] =
        RouteAndDispatch({{1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}}, 2, 1, dispatch);
    EXPECT_EQ(a.count(1), 5) << static_cast<int>(scope);
    EXPECT_EQ(stats.dropped, (std::vector<int64_t>{0, 0})) << static_cast<int>(scope);
  }
}

TEST(ExpertDispatchTest, AuxLossBalancedIsOneCollapsedIsE) {
  RouterStepStats balanced;
  balanced.Reset(4);
  balanced.tokens = 8;
  balanced.routed = {2, 2, 2, 2};
  balanced.prob_sum = {2, 2, 2, 2};
  const BalanceFigures b = ComputeBalance(balanced, 1);
  EXPECT_NEAR(b.aux_loss, 1.0, 1e-12);
  EXPECT_NEAR(b.load_cv, 0.0, 1e-12);
  EXPECT_NEAR(b.entropy, std::log(4.0), 1e-12);
  EXPECT_NEAR(b.max_utilization, 1.0, 1e-12);
  EXPECT_EQ(b.dead_fraction, 0.0);

  RouterStepStats collapsed;
  collapsed.Reset(4);
  collapsed.tokens = 8;
  collapsed.routed = {8, 0, 0, 0};
  collapsed.prob_sum = {8, 0, 0, 0};
  const BalanceFigures c = ComputeBalance(collapsed, 1);
  EXPECT_NEAR(c.aux_loss, 4.0, 1e-12);
  EXPECT_NEAR(c.dead_fraction, 0.75, 1e-12);
  EXPECT_NEAR(c.max_utilization, 4.0, 1e-12);

  // Through the router: every token strongly prefers expert 2.
  std::vector<float> z(8 * 4, -20.0f);
  for (int t = 0; t < 8; ++t) z[t * 4 + 2] = 20.0f;
  RouterDecision d;
  RouteTokens(z.data(), 4, 8, 4, 1, GateFunction::kSoftmax, false, &d);
  ExpertAssignments a;
  RouterStepStats stats;
  stats.Reset(4);
  DispatchTokens(d, Capacity(0.0, 0, OverflowPolicy::kDrop), nullptr, &a, &stats);
  EXPECT_NEAR(ComputeBalance(stats, 1).aux_loss, 4.0, 1e-6);
}

// With k experts a token, a balanced expert receives T·k/E assignments:
// utilisation is load over that share, so a balanced top-2 router is at 1
// (not 2) and one expert taking every token's first choice at E/k.
TEST(ExpertDispatchTest, UtilisationCountsEveryTokensKAssignments) {
  RouterStepStats balanced;
  balanced.Reset(4);
  balanced.tokens = 8;
  balanced.routed = {4, 4, 4, 4};  // 8 tokens x 2
  balanced.prob_sum = {2, 2, 2, 2};
  EXPECT_NEAR(ComputeBalance(balanced, 2).max_utilization, 1.0, 1e-12);
  RouterStepStats crowded = balanced;
  crowded.routed = {8, 4, 2, 2};
  EXPECT_NEAR(ComputeBalance(crowded, 2).max_utilization, 2.0, 1e-12);  // 8 / (8 * 2 / 4)
}

}  // namespace
}  // namespace switchserve
