// DispatchTokens under the sequence capacity scope (engine/moe/expert_dispatch.h):
// cases worked out by hand (group boundaries, loads carried across chunks,
// sequences side by side, reroute rules, min_capacity, ties), and random
// routings against a straightforward formulation of the rule written here
// (one sequence at a time, every group replayed from position 0) and against
// the parallel formulation the header gives for a GPU port.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "gtest/gtest.h"
#include "tests/util/ranked_logits.h"

namespace switchserve {
namespace {

using testing::RankedLogits;

DispatchConfig SequenceScope(int group, double factor, int min_capacity, OverflowPolicy overflow) {
  DispatchConfig d;
  d.scope = CapacityScope::kSequence;
  d.capacity_group = group;
  d.capacity_factor = factor;
  d.min_capacity = min_capacity;
  d.overflow = overflow;
  return d;
}

// One router's tokens placed in sequences: rows of `loads` (`stride` apart).
struct Placement {
  std::vector<int32_t> sequence;
  std::vector<int32_t> position;
  std::vector<int32_t> loads;
  int stride = 0;

  SequenceGroups groups() {
    return {sequence.data(), position.data(), loads.data(), static_cast<int64_t>(stride)};
  }
};

std::vector<RouteFate> Fates(const ExpertAssignments& a) {
  std::vector<RouteFate> fates;
  for (const RouteChoice& c : a.trace) fates.push_back(c.fate);
  return fates;
}

constexpr RouteFate kKept = RouteFate::kKept;
constexpr RouteFate kRerouted = RouteFate::kRerouted;
constexpr RouteFate kDropped = RouteFate::kDropped;

// Seven positions of one sequence, every token preferring expert 0, then 1.
// G = 3, k = 1, E = 2, cf 0.5: C = ceil(0.5 * 3 * 1 / 2) = 1 per group
// [0, 3), [3, 6) and the partial [6, 7).
TEST(SequenceDispatchTest, CapacityRestartsAtEveryGroupBoundary) {
  const auto z = RankedLogits(std::vector<std::vector<int>>(7, {0, 1}), 2);
  RouterDecision d;
  RouteTokens(z.data(), 2, 7, 2, 1, GateFunction::kSigmoid, false, &d);
  ExpertAssignments a;
  RouterStepStats stats;
  stats.Reset(2);
  DispatchTokens(d, SequenceScope(3, 0.5, 0, OverflowPolicy::kDrop), nullptr, &a, &stats);
  EXPECT_EQ(a.capacity, 1);
  EXPECT_EQ(Fates(a),
            (std::vector<RouteFate>{kKept, kDropped, kDropped, kKept, kDropped, kDropped, kKept}));
  ASSERT_EQ(a.count(0), 3);
  EXPECT_EQ(a.token[a.begin(0)], 0);
  EXPECT_EQ(a.token[a.begin(0) + 1], 3);
  EXPECT_EQ(a.token[a.begin(0) + 2], 6);
  EXPECT_EQ(stats.kept, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(stats.dropped, (std::vector<int64_t>{4, 0}));

  // reroute: the second token of each group moves to expert 1, the third
  // finds both full.
  DispatchTokens(d, SequenceScope(3, 0.5, 0, OverflowPolicy::kReroute), nullptr, &a, nullptr);
  EXPECT_EQ(Fates(a), (std::vector<RouteFate>{kKept, kRerouted, kDropped, kKept, kRerouted,
                                              kDropped, kKept}));
  EXPECT_EQ(a.trace[1].expert, 1);
  EXPECT_EQ(a.trace[4].expert, 1);
  EXPECT_EQ(a.trace[2].expert, 0);  // dropped: the expert it was routed to
}

// The same sequence in chunks [0, 2) and [2, 5): the loads it carries make
// the second chunk decide exactly as the full pass, and they hold the
// group's counts after each chunk.
TEST(SequenceDispatchTest, LoadsCarryAcrossChunks) {
  const auto z = RankedLogits(std::vector<std::vector<int>>(5, {0, 1}), 2);
  for (OverflowPolicy policy : {OverflowPolicy::kDrop, OverflowPolicy::kReroute}) {
    const DispatchConfig dispatch = SequenceScope(3, 0.5, 0, policy);
    RouterDecision full_decision;
    RouteTokens(z.data(), 2, 5, 2, 1, GateFunction::kSigmoid, false, &full_decision);
    ExpertAssignments full;
    DispatchTokens(full_decision, dispatch, nullptr, &full, nullptr);

    // Chunk 1: positions 0, 1 with garbage carried in (position 0 opens a
    // group, so it is never read).
    Placement first{{0, 0}, {0, 1}, {9, 9}, 2};
    RouterDecision d;
    RouteTokens(z.data(), 2, 2, 2, 1, GateFunction::kSigmoid, false, &d);
    ExpertAssignments a;
    SequenceGroups groups = first.groups();
    DispatchTokens(d, dispatch, &groups, &a, nullptr);
    const bool reroute = policy == OverflowPolicy::kReroute;
    EXPECT_EQ(first.loads, (std::vector<int32_t>{1, reroute ? 1 : 0}));
    EXPECT_EQ(a.trace[1].fate, full.trace[1].fate);

    // Chunk 2: positions 2, 3, 4, continuing group [0, 3) then opening [3, 6).
    Placement second{{0, 0, 0}, {2, 3, 4}, first.loads, 2};
    RouteTokens(z.data() + 2 * 2, 2, 3, 2, 1, GateFunction::kSigmoid, false, &d);
    groups = second.groups();
    DispatchTokens(d, dispatch, &groups, &a, nullptr);
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(a.trace[t].fate, full.trace[2 + t].fate) << "position " << 2 + t;
      EXPECT_EQ(a.trace[t].expert, full.trace[2 + t].expert) << "position " << 2 + t;
    }
    EXPECT_EQ(second.loads, (std::vector<int32_t>{1, reroute ? 1 : 0}));  // group [3, 6)

    // Without the carried loads position 2 would have been kept.
    Placement forgotten{{0, 0, 0}, {2, 3, 4}, {0, 0}, 2};
    groups = forgotten.groups();
    DispatchTokens(d, dispatch, &groups, &a, nullptr);
    EXPECT_EQ(a.trace[0].fate, kKept);
    EXPECT_NE(a.trace[0].fate, full.trace[2].fate);
  }
}

// Two sequences in one call, in either order, with rows of `loads` 5 apart:
// each decides as if alone; a crowd in one never reaches the other.
TEST(SequenceDispatchTest, SequencesInOneStepAreIndependent) {
  // Sequence A: 4 tokens all wanting expert 0. Sequence B: 2 tokens wanting
  // 0, then 2 wanting 1. E = 3, k = 1, G = 8, cf 0.25: C = ceil(0.667) = 1.
  const std::vector<std::vector<int>> a_order(4, {0, 1, 2});
  const std::vector<std::vector<int>> b_order = {{0, 2, 1}, {0, 2, 1}, {1, 0, 2}, {1, 0, 2}};
  const DispatchConfig dispatch = SequenceScope(8, 0.25, 0, OverflowPolicy::kReroute);
  auto alone = [&](const std::vector<std::vector<int>>& order) {
    const auto z = RankedLogits(order, 3);
    RouterDecision d;
    RouteTokens(z.data(), 3, static_cast<int>(order.size()), 3, 1, GateFunction::kSigmoid, false,
                &d);
    ExpertAssignments out;
    DispatchTokens(d, dispatch, nullptr, &out, nullptr);
    return out.trace;
  };
  const std::vector<RouteChoice> want_a = alone(a_order), want_b = alone(b_order);
  EXPECT_EQ(want_a[2].fate, kRerouted);  // 0 kept, 1 -> 1, 2 -> 2, 3 dropped
  EXPECT_EQ(want_a[3].fate, kDropped);

  for (bool b_first : {false, true}) {
    std::vector<std::vector<int>> order;
    Placement p;
    p.stride = 5;
    p.loads.assign(2 * 5, 0);
    auto add = [&](const std::vector<std::vector<int>>& o, int row) {
      for (size_t i = 0; i < o.size(); ++i) {
        order.push_back(o[i]);
        p.sequence.push_back(row);
        p.position.push_back(static_cast<int32_t>(i));
      }
    };
    if (b_first) {
      add(b_order, 1);
      add(a_order, 0);
    } else {
      add(a_order, 0);
      add(b_order, 1);
    }
    const auto z = RankedLogits(order, 3);
    RouterDecision d;
    RouteTokens(z.data(), 3, 8, 3, 1, GateFunction::kSigmoid, false, &d);
    ExpertAssignments out;
    SequenceGroups groups = p.groups();
    DispatchTokens(d, dispatch, &groups, &out, nullptr);
    const int a0 = b_first ? 4 : 0, b0 = b_first ? 0 : 4;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(out.trace[a0 + i].expert, want_a[i].expert) << "A " << i;
      EXPECT_EQ(out.trace[a0 + i].fate, want_a[i].fate) << "A " << i;
      EXPECT_EQ(out.trace[b0 + i].expert, want_b[i].expert) << "B " << i;
      EXPECT_EQ(out.trace[b0 + i].fate, want_b[i].fate) << "B " << i;
    }
    EXPECT_EQ(std::vector<int32_t>(p.loads.begin(), p.loads.begin() + 3),
              (std::vector<int32_t>{1, 1, 1}));
    EXPECT_EQ(std::vector<int32_t>(p.loads.begin() + 5, p.loads.begin() + 8),
              (std::vector<int32_t>{1, 1, 1}));  // B: 0, 2 (rerouted), 1, and one drop
    EXPECT_EQ(p.loads[3] + p.loads[4] + p.loads[8] + p.loads[9], 0);  // stride gaps untouched
  }
}

// Position order within a group, each position's k choices in rank order:
// a first choice of a later token cannot take a slot from an earlier token's
// second choice (unlike the step scope's rank-major order).
TEST(SequenceDispatchTest, FillsPositionMajorThenRank) {
  const auto z = RankedLogits({{0, 1, 2}, {1, 2, 0}}, 3);  // E = 3, k = 2
  RouterDecision d;
  RouteTokens(z.data(), 3, 2, 3, 2, GateFunction::kSigmoid, false, &d);
  ExpertAssignments a;
  // C = max(1, ceil(0.1 * 4 * 2 / 3)) = 1.
  DispatchTokens(d, SequenceScope(4, 0.1, 1, OverflowPolicy::kDrop), nullptr, &a, nullptr);
  ASSERT_EQ(a.capacity, 1);
  // Token 0 takes 0 and 1; token 1's first choice (1) is full, its second (2) free.
  EXPECT_EQ(Fates(a), (std::vector<RouteFate>{kKept, kKept, kDropped, kKept}));
  // The step scope, rank-major, gives expert 1 to token 1's first choice.
  DispatchConfig step = SequenceScope(4, 0.1, 1, OverflowPolicy::kDrop);
  step.scope = CapacityScope::kStep;
  DispatchTokens(d, step, nullptr, &a, nullptr);
  EXPECT_EQ(Fates(a), (std::vector<RouteFate>{kKept, kDropped, kKept, kKept}));
}

// A rerouted assignment never goes to one of the token's own k choices (a
// later rank's included) nor to an expert it was already moved to.
TEST(SequenceDispatchTest, RerouteSkipsOwnChoicesAndEarlierTargets) {
  // E = 4, k = 2, C = 1 (min_capacity 1, cf tiny).
  const auto z = RankedLogits({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 2, 3, 1}}, 4);
  RouterDecision d;
  RouteTokens(z.data(), 4, 3, 4, 2, GateFunction::kSigmoid, false, &d);
  ExpertAssignments a;
  RouterStepStats stats;
  stats.Reset(4);
  DispatchTokens(d, SequenceScope(16, 0.01, 1, OverflowPolicy::kReroute), nullptr, &a, &stats);
  ASSERT_EQ(a.capacity, 1);
  // Token 0 keeps 0 and 1. Token 1: rank 0 (0 full) -> 2, its best unchosen
  // free expert; rank 1 (1 full) -> not 2 again: 3. Token 2 (choices 0, 2):
  // everything is full -> both dropped.
  EXPECT_EQ(Fates(a),
            (std::vector<RouteFate>{kKept, kKept, kRerouted, kRerouted, kDropped, kDropped}));
  EXPECT_EQ(a.trace[2].expert, 2);
  EXPECT_EQ(a.trace[3].expert, 3);
  EXPECT_FLOAT_EQ(a.trace[3].gate, d.weight[3]);  // keeps the weight of the choice it replaces
  EXPECT_EQ(stats.rerouted, (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(stats.kept, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(stats.dropped, (std::vector<int64_t>{1, 0, 1, 0}));

  // One token whose first choice is full: its own second choice (2, free)
  // is not a reroute target; 3 is.
  const auto y = RankedLogits({{0, 1, 2, 3}, {0, 2, 3, 1}}, 4);
  RouteTokens(y.data(), 4, 2, 4, 2, GateFunction::kSigmoid, false, &d);
  DispatchTokens(d, SequenceScope(16, 0.01, 1, OverflowPolicy::kReroute), nullptr, &a, nullptr);
  EXPECT_EQ(a.trace[2].fate, kRerouted);
  EXPECT_EQ(a.trace[2].expert, 3);
  EXPECT_EQ(a.trace[3].fate, kKept);
  EXPECT_EQ(a.trace[3].expert, 2);
}

// The same rule where the first target still has room: C = 2, so only the
// record of the first move keeps the second one off expert 2.
TEST(SequenceDispatchTest, RerouteNeverMovesATokenTwiceToTheSameExpert) {
  // E = 4, k = 2, C = 2 (min_capacity 2). Tokens 0 and 1 fill experts 0 and
  // 1. Token 2: rank 0 (0 full) -> 2, which keeps one free slot; rank 1
  // (1 full) -> 3, not 2 again.
  const auto z = RankedLogits({{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}, 4);
  RouterDecision d;
  RouteTokens(z.data(), 4, 3, 4, 2, GateFunction::kSigmoid, false, &d);
  ExpertAssignments a;
  DispatchTokens(d, SequenceScope(16, 0.01, 2, OverflowPolicy::kReroute), nullptr, &a, nullptr);
  ASSERT_EQ(a.capacity, 2);
  EXPECT_EQ(Fates(a), (std::vector<RouteFate>{kKept, kKept, kKept, kKept, kRerouted, kRerouted}));
  EXPECT_EQ(a.trace[4].expert, 2);
  EXPECT_EQ(a.trace[5].expert, 3);
}

// min_capacity raises C above the factor's share: C = max(2, ceil(0.25 * 4 *
// 1 / 4)) = 2 per group of 4.
TEST(SequenceDispatchTest, MinCapacityRaisesTheGroupCapacity) {
  const auto z = RankedLogits(std::vector<std::vector<int>>(6, {2, 0}), 4);
  RouterDecision d;
  RouteTokens(z.data(), 4, 6, 4, 1, GateFunction::kSigmoid, false, &d);
  ExpertAssignments a;
  DispatchTokens(d, SequenceScope(4, 0.25, 2, OverflowPolicy::kDrop), nullptr, &a, nullptr);
  EXPECT_EQ(a.capacity, 2);
  EXPECT_EQ(Fates(a), (std::vector<RouteFate>{kKept, kKept, kDropped, kDropped, kKept, kKept}));
  DispatchTokens(d, SequenceScope(4, 0.25, 0, OverflowPolicy::kDrop), nullptr, &a, nullptr);
  EXPECT_EQ(a.capacity, 1);
}

// Reroute candidates with equal logits go to the lower expert index.
TEST(SequenceDispatchTest, RerouteTiesGoToTheLowerExpert) {
  // Token 0 takes expert 0; token 1 (also 0 first) ties between 3 and 2.
  std::vector<float> z = {3, 1, -5, -5, 3, -5, 0.5f, 0.5f};
  RouterDecision d;
  RouteTokens(z.data(), 4, 2, 4, 1, GateFunction::kSigmoid, false, &d);
  ExpertAssignments a;
  DispatchTokens(d, SequenceScope(8, 0.01, 1, OverflowPolicy::kReroute), nullptr, &a, nullptr);
  EXPECT_EQ(a.trace[1].fate, kRerouted);
  EXPECT_EQ(a.trace[1].expert, 2);
}

// Dropless keeps everything and neither reads nor writes the loads.
TEST(SequenceDispatchTest, DroplessLeavesLoadsAlone) {
  const auto z = RankedLogits(std::vector<std::vector<int>>(5, {1, 0}), 2);
  RouterDecision d;
  RouteTokens(z.data(), 2, 5, 2, 2, GateFunction::kSigmoid, false, &d);
  Placement p{{0, 0, 0, 0, 0}, {3, 4, 5, 6, 7}, {7, 7}, 2};
  SequenceGroups groups = p.groups();
  ExpertAssignments a;
  DispatchTokens(d, SequenceScope(2, 0.0, 1, OverflowPolicy::kDrop), &groups, &a, nullptr);
  EXPECT_EQ(a.count(0), 5);
  EXPECT_EQ(a.count(1), 5);
  EXPECT_EQ(p.loads, (std::vector<int32_t>{7, 7}));
}

// The rule stated plainly, for one whole sequence from position 0: groups of
// G positions, fresh loads per group, positions in order, ranks in order.
// Returns [len, k] (expert, fate).
std::vector<RouteChoice> StraightforwardDispatch(const std::vector<float>& logits, int len, int E,
                                                 int k, const DispatchConfig& dispatch) {
  std::vector<RouteChoice> out(static_cast<size_t>(len) * k);
  const int G = dispatch.capacity_group;
  const int64_t C = dispatch.CapacityPerExpert(G, k, E);
  for (int group_start = 0; group_start < len; group_start += G) {
    std::vector<int64_t> load(E, 0);
    for (int p = group_start; p < std::min(len, group_start + G); ++p) {
      std::vector<int> ranking(E);
      for (int e = 0; e < E; ++e) ranking[e] = e;
      std::stable_sort(ranking.begin(), ranking.end(), [&](int a, int b) {
        return logits[static_cast<size_t>(p) * E + a] > logits[static_cast<size_t>(p) * E + b];
      });
      const std::set<int> own(ranking.begin(), ranking.begin() + k);
      std::set<int> moved_to;
      for (int r = 0; r < k; ++r) {
        RouteChoice& c = out[static_cast<size_t>(p) * k + r];
        c.expert = ranking[r];
        if (dispatch.Dropless() || load[c.expert] < C) {
          c.fate = RouteFate::kKept;
          ++load[c.expert];
          continue;
        }
        c.fate = RouteFate::kDropped;
        if (dispatch.overflow != OverflowPolicy::kReroute) continue;
        for (int candidate : ranking) {
          if (own.count(candidate) || moved_to.count(candidate) || load[candidate] >= C) continue;
          c.expert = candidate;
          c.fate = RouteFate::kRerouted;
          moved_to.insert(candidate);
          ++load[candidate];
          break;
        }
      }
    }
  }
  return out;
}

// Random routings of several sequences, run in random chunks over several
// steps (sequences in a random order within each step, loads rows with gaps
// and garbage where they are never to be read), against the straightforward
// rule on each whole sequence; for drop, also against the parallel
// formulation: kept iff the carried load plus the exclusive count of earlier
// assignments of the group to the same expert is below C.
TEST(SequenceDispatchTest, RandomChunkedStepsMatchTheStraightforwardRule) {
  std::mt19937 rng(20240611);
  int checked_drops = 0, checked_reroutes = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int E = 2 + static_cast<int>(rng() % 7);
    const int k = 1 + static_cast<int>(rng() % std::min(3, E));
    const int policy = static_cast<int>(rng() % 3);  // drop, reroute, dropless
    const int groups[] = {1, 2, 3, 5, 8, 13};
    const double factors[] = {0.25, 0.5, 1.0, 1.5};
    DispatchConfig dispatch =
        SequenceScope(groups[rng() % 6], factors[rng() % 4], static_cast<int>(rng() % 3),
                      policy == 1 ? OverflowPolicy::kReroute : OverflowPolicy::kDrop);
    if (policy == 2) dispatch.capacity_factor = 0;
    const int S = 1 + static_cast<int>(rng() % 4);
    std::vector<int> len(S);
    std::vector<std::vector<float>> logits(S);
    std::normal_distribution<float> normal;
    for (int s = 0; s < S; ++s) {
      len[s] = 1 + static_cast<int>(rng() % 20);
      for (int i = 0; i < len[s] * E; ++i) logits[s].push_back(normal(rng));
    }

    const int stride = E + 2;
    std::vector<std::vector<int32_t>> carried(S, std::vector<int32_t>(E, 0));
    std::vector<int> done(S, 0);
    std::vector<std::vector<RouteChoice>> got(S);
    for (int s = 0; s < S; ++s) got[s].resize(static_cast<size_t>(len[s]) * k);
    int64_t dropped_total = 0, rerouted_total = 0;
    while (done != len) {
      std::vector<int> order(S);
      for (int s = 0; s < S; ++s) order[s] = s;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<float> z;
      Placement p;
      p.stride = stride;
      std::vector<int> row_of, chunk;
      for (int s : order) {
        const int n = std::min(len[s] - done[s], static_cast<int>(rng() % 5));
        if (n == 0) continue;
        const int row = static_cast<int>(row_of.size());
        row_of.push_back(s);
        chunk.push_back(n);
        for (int i = 0; i < n; ++i) {
          p.sequence.push_back(row);
          p.position.push_back(done[s] + i);
        }
        z.insert(z.end(), logits[s].begin() + static_cast<int64_t>(done[s]) * E,
                 logits[s].begin() + static_cast<int64_t>(done[s] + n) * E);
        // The carried loads, or garbage where the chunk opens a group.
        const bool opens = done[s] % dispatch.capacity_group == 0;
        for (int e = 0; e < stride; ++e) {
          p.loads.push_back(e < E && !opens ? carried[s][e]
                                            : 100 + static_cast<int32_t>(rng() % 9));
        }
      }
      if (row_of.empty()) continue;
      const int T = static_cast<int>(p.sequence.size());
      RouterDecision d;
      RouteTokens(z.data(), E, T, E, k, GateFunction::kSigmoid, false, &d);
      ExpertAssignments a;
      RouterStepStats stats;
      stats.Reset(E);
      SequenceGroups view = p.groups();
      DispatchTokens(d, dispatch, &view, &a, &stats);
      for (int e = 0; e < E; ++e) {
        dropped_total += stats.dropped[e];
        rerouted_total += stats.rerouted[e];
      }
      for (int t = 0; t < T; ++t) {
        const int s = row_of[p.sequence[t]];
        for (int r = 0; r < k; ++r) {
          got[s][static_cast<size_t>(p.position[t]) * k + r] =
              a.trace[static_cast<size_t>(t) * k + r];
        }
      }
      for (size_t row = 0; row < row_of.size(); ++row) {
        const int s = row_of[row];
        if (!dispatch.Dropless()) {
          carried[s].assign(p.loads.begin() + row * stride, p.loads.begin() + row * stride + E);
        }
        done[s] += chunk[row];
      }
    }

    for (int s = 0; s < S; ++s) {
      const std::vector<RouteChoice> want =
          StraightforwardDispatch(logits[s], len[s], E, k, dispatch);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[s][i].fate, want[i].fate)
            << "trial " << trial << " sequence " << s << " choice " << i;
        ASSERT_EQ(got[s][i].expert, want[i].expert)
            << "trial " << trial << " sequence " << s << " choice " << i;
      }
      if (policy != 0) continue;
      // Parallel formulation of drop: the slot asked for is the exclusive
      // count of the group's earlier assignments to the same expert.
      const int G = dispatch.capacity_group;
      const int64_t C = dispatch.CapacityPerExpert(G, k, E);
      for (int pos = 0; pos < len[s]; ++pos) {
        for (int r = 0; r < k; ++r) {
          const int e = got[s][static_cast<size_t>(pos) * k + r].expert;
          int64_t earlier = 0;
          for (int q = pos - pos % G; q <= pos; ++q) {
            for (int rr = 0; rr < (q == pos ? r : k); ++rr) {
              earlier += got[s][static_cast<size_t>(q) * k + rr].expert == e;
            }
          }
          ASSERT_EQ(got[s][static_cast<size_t>(pos) * k + r].fate,
                    earlier < C ? RouteFate::kKept : RouteFate::kDropped)
              << "trial " << trial << " position " << pos;
        }
      }
    }
    checked_drops += dropped_total > 0;
    checked_reroutes += rerouted_total > 0;
  }
  // The random cases did exercise both overflow paths.
  EXPECT_GT(checked_drops, 50);
  EXPECT_GT(checked_reroutes, 20);
}

}  // namespace
}  // namespace switchserve
