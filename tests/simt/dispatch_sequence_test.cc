// Capacity dispatch under the sequence scope on the device
// (kernels/cuda/dispatch_plan.h, SequenceScope) against a reference written
// from the scope's rules (docs/design.md): several sequences per step, chunks
// that continue a carried group and chunks that open one, groups of 1 to 128
// positions, drop, reroute and dropless, tied logits; traces, slots in
// (token, rank) order, statistics and the loads each sequence carries out,
// bit for bit, in every thread order; and against the CPU's DispatchTokens
// (engine/moe/expert_dispatch.h) in the same scope.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "kernels/cuda/dispatch_plan.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using cuda::DispatchMode;

// One step: sequence s has tokens [first[s], first[s + 1]) at positions
// start[s], start[s] + 1, ...; `carried` [S, E] its loads coming in.
struct Step {
  std::vector<int32_t> positions, token_sequence, first = {0};
  std::vector<int32_t> carried;
  int tokens = 0;
};

Step MakeStep(int sequences, int group, int E, std::mt19937_64& rng) {
  Step step;
  for (int s = 0; s < sequences; ++s) {
    const int length = 1 + static_cast<int>(rng() % (2 * group + 5));
    const int start = static_cast<int>(rng() % (3 * group + 2));
    for (int i = 0; i < length; ++i) {
      step.positions.push_back(start + i);
      step.token_sequence.push_back(s);
    }
    step.first.push_back(static_cast<int32_t>(step.positions.size()));
    for (int e = 0; e < E; ++e) step.carried.push_back(static_cast<int32_t>(rng() % 3));
  }
  step.tokens = static_cast<int>(step.positions.size());
  return step;
}

// Segments: a sequence's tokens from its first one or from a group boundary.
void Segments(const Step& step, int group, std::vector<int32_t>* first,
              std::vector<int32_t>* count) {
  for (int t = 0; t < step.tokens; ++t) {
    const bool starts = t == 0 || step.token_sequence[t] != step.token_sequence[t - 1] ||
                        step.positions[t] % group == 0;
    if (starts) {
      first->push_back(t);
      count->push_back(0);
    }
    ++count->back();
  }
}

struct Result {
  std::vector<int32_t> trace_expert;
  std::vector<float> trace_gate;
  std::vector<uint8_t> trace_fate;
  std::vector<int32_t> offsets, slot_token;
  std::vector<float> slot_weight;
  std::vector<int32_t> counts;
  std::vector<double> prob_sum;
  std::vector<int32_t> carried_out;
};

// The scope's rules, one assignment after another.
Result Reference(const RouterDecision& d, const Step& step, int group, int64_t capacity,
                 bool reroute, bool dropless) {
  const int T = d.tokens, E = d.n_experts, K = d.top_k;
  Result out;
  out.trace_expert.assign(static_cast<size_t>(T) * K, 0);
  out.trace_gate.assign(out.trace_expert.size(), 0);
  out.trace_fate.assign(out.trace_expert.size(), 0);
  out.carried_out = step.carried;
  for (int t = 0; t < T; ++t) {
    int32_t* load = out.carried_out.data() + static_cast<size_t>(step.token_sequence[t]) * E;
    if (!dropless && step.positions[t] % group == 0) std::fill(load, load + E, 0);
    std::vector<uint8_t> taken(E, 0);
    for (int r = 0; r < K; ++r) taken[d.expert[static_cast<size_t>(t) * K + r]] = 1;
    for (int r = 0; r < K; ++r) {
      const size_t a = static_cast<size_t>(t) * K + r;
      const int e = d.expert[a];
      out.trace_expert[a] = e;
      out.trace_gate[a] = d.weight[a];
      if (dropless || load[e] < capacity) {
        out.trace_fate[a] = 0;
        if (!dropless) ++load[e];
        continue;
      }
      int target = -1;
      if (reroute) {
        const float* score = d.score.data() + static_cast<size_t>(t) * E;
        for (int x = 0; x < E; ++x) {
          if (taken[x] != 0 || load[x] >= capacity) continue;
          if (target < 0 || score[x] > score[target]) target = x;
        }
      }
      if (target >= 0) {
        taken[target] = 1;
        ++load[target];
        out.trace_expert[a] = target;
        out.trace_fate[a] = 1;
      } else {
        out.trace_fate[a] = 2;
      }
    }
  }
  // Slots by final expert in (token, rank) order; statistics.
  out.offsets.assign(E + 1, 0);
  for (size_t a = 0; a < out.trace_fate.size(); ++a) {
    if (out.trace_fate[a] != 2) ++out.offsets[out.trace_expert[a] + 1];
  }
  for (int e = 0; e < E; ++e) out.offsets[e + 1] += out.offsets[e];
  std::vector<int32_t> cursor(out.offsets.begin(), out.offsets.end() - 1);
  out.slot_token.assign(out.offsets[E], 0);
  out.slot_weight.assign(out.offsets[E], 0);
  out.counts.assign(4 * E, 0);
  out.prob_sum.assign(E, 0);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) out.prob_sum[e] += d.prob[static_cast<size_t>(t) * E + e];
    for (int r = 0; r < K; ++r) {
      const size_t a = static_cast<size_t>(t) * K + r;
      const int routed = d.expert[a], final_expert = out.trace_expert[a];
      ++out.counts[routed];
      if (out.trace_fate[a] == 2) {
        ++out.counts[3 * E + routed];
        continue;
      }
      if (out.trace_fate[a] == 1) ++out.counts[2 * E + routed];
      ++out.counts[E + final_expert];
      const int32_t slot = cursor[final_expert]++;
      out.slot_token[slot] = t;
      out.slot_weight[slot] = out.trace_gate[a];
    }
  }
  return out;
}

Result OnDevice(const RouterDecision& d, const Step& step, int group, int64_t capacity,
                DispatchMode mode) {
  const int T = d.tokens, E = d.n_experts, K = d.top_k;
  const int S = static_cast<int>(step.first.size()) - 1;
  std::vector<int32_t> seg_first, seg_count;
  Segments(step, group, &seg_first, &seg_count);
  const size_t n = static_cast<size_t>(T) * K;
  return std::make_from_tuple<Result>(InEveryOrder([&] {
    DeviceArray<int32_t> expert(d.expert), positions(step.positions), sequence(step.token_sequence),
        carried(step.carried), carried_out(step.carried), first(seg_first), count(seg_count),
        trace_expert(n), offsets(E + 1), slot_token(n), counts(4 * E), assign_slot(n),
        loads(seg_first.size() * E);
    DeviceArray<float> weight(d.weight), score(d.score), prob(d.prob), trace_gate(n),
        slot_weight(n);
    DeviceArray<uint8_t> trace_fate(n), taken(seg_first.size() * E);
    DeviceArray<double> prob_sum(E);
    cuda::SequenceScope q;
    q.segment_first = first.get();
    q.segment_count = count.get();
    q.segments = static_cast<int>(seg_first.size());
    q.group_size = group;
    q.positions = positions.get();
    q.token_sequence = sequence.get();
    q.carried = carried.get();
    q.carried_out = carried_out.get();
    q.stride = E;
    q.scratch_loads = loads.get();
    q.scratch_taken = taken.get();
    cuda::DispatchPlanInput in;
    in.expert = expert.get();
    in.weight = weight.get();
    in.score = score.get();
    in.score_ld = E;
    in.prob = prob.get();
    in.tokens = T;
    in.top_k = K;
    in.n_experts = E;
    in.capacity = capacity;
    in.mode = mode;
    in.sequence = &q;
    cuda::DispatchPlanOutput out{trace_expert.get(), trace_gate.get(), trace_fate.get(),
                                 offsets.get(),      slot_token.get(), slot_weight.get(),
                                 counts.get(),       prob_sum.get(),   assign_slot.get()};
    EXPECT_EQ(cuda::LaunchDispatchPlan(in, out, nullptr), cudaSuccess);
    std::vector<int32_t> offs = offsets.Download();
    std::vector<int32_t> tokens = slot_token.Download();
    std::vector<float> weights = slot_weight.Download();
    tokens.resize(offs[E]);
    weights.resize(offs[E]);
    std::vector<int32_t> carried_back = carried_out.Download();
    carried_back.resize(static_cast<size_t>(S) * E);
    return std::make_tuple(trace_expert.Download(), trace_gate.Download(), trace_fate.Download(),
                           offs, tokens, weights, counts.Download(), prob_sum.Download(),
                           carried_back);
  }));
}

TEST(SimtSequenceDispatch, MatchesTheScopesRules) {
  SIMT_REQUIRE_DEVICE();
  std::mt19937_64 rng(2027);
  for (int trial = 0; trial < 48; ++trial) {
    const int E = std::vector<int>{2, 4, 8, 32}[trial % 4];
    const int K = 1 + static_cast<int>(rng() % std::min(E, 3));
    const int group = std::vector<int>{1, 3, 8, 128}[(trial / 4) % 4];
    const double factor = std::vector<double>{0.5, 1.0, 2.0}[trial % 3];
    const int policy = trial % 3;  // drop, reroute, dropless
    const bool tied = trial % 2 == 1;
    const Step step = MakeStep(1 + static_cast<int>(rng() % 4), group, E, rng);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": T=" + std::to_string(step.tokens) +
                 " E=" + std::to_string(E) + " k=" + std::to_string(K) +
                 " G=" + std::to_string(group) + " policy " + std::to_string(policy));
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    std::vector<float> logits(static_cast<size_t>(step.tokens) * E);
    for (float& z : logits) z = tied ? static_cast<float>(rng() % 3) : uniform(rng);
    RouterDecision d;
    RouteTokens(logits.data(), E, step.tokens, E, K, GateFunction::kSoftmax, false, &d);
    DispatchConfig config;
    config.capacity_factor = policy == 2 ? 0.0 : factor;
    const int64_t capacity = policy == 2 ? 0 : config.CapacityPerExpert(group, K, E);
    const DispatchMode mode = policy == 0   ? DispatchMode::kDrop
                              : policy == 1 ? DispatchMode::kReroute
                                            : DispatchMode::kDropless;
    const Result want = Reference(d, step, group, capacity, policy == 1, policy == 2);
    const Result got = OnDevice(d, step, group, capacity, mode);
    EXPECT_EQ(got.trace_expert, want.trace_expert);
    EXPECT_EQ(got.trace_gate, want.trace_gate);
    EXPECT_EQ(got.trace_fate, want.trace_fate);
    EXPECT_EQ(got.offsets, want.offsets);
    EXPECT_EQ(got.slot_token, want.slot_token);
    EXPECT_EQ(got.slot_weight, want.slot_weight);
    EXPECT_EQ(got.counts, want.counts);
    EXPECT_EQ(got.prob_sum, want.prob_sum);
    EXPECT_EQ(got.carried_out, want.carried_out);

    // The CPU backend's dispatch of the same decision.
    config.scope = CapacityScope::kSequence;
    config.capacity_group = group;
    config.overflow = policy == 1 ? OverflowPolicy::kReroute : OverflowPolicy::kDrop;
    std::vector<int32_t> cpu_loads = step.carried;
    const SequenceGroups groups{step.token_sequence.data(), step.positions.data(), cpu_loads.data(),
                                E};
    ExpertAssignments cpu;
    RouterStepStats stats;
    stats.Reset(E);
    DispatchTokens(d, config, &groups, &cpu, &stats);
    for (size_t a = 0; a < cpu.trace.size(); ++a) {
      ASSERT_EQ(got.trace_expert[a], cpu.trace[a].expert) << "assignment " << a;
      ASSERT_EQ(got.trace_gate[a], cpu.trace[a].gate) << "assignment " << a;
      ASSERT_EQ(got.trace_fate[a], static_cast<uint8_t>(cpu.trace[a].fate)) << "assignment " << a;
    }
    EXPECT_EQ(got.offsets, cpu.offsets);
    EXPECT_EQ(got.slot_token, cpu.token);
    EXPECT_EQ(got.slot_weight, cpu.weight);
    for (int e = 0; e < E; ++e) {
      EXPECT_EQ(got.counts[e], stats.routed[e]) << "expert " << e;
      EXPECT_EQ(got.counts[E + e], stats.kept[e]) << "expert " << e;
      EXPECT_EQ(got.counts[2 * E + e], stats.rerouted[e]) << "expert " << e;
      EXPECT_EQ(got.counts[3 * E + e], stats.dropped[e]) << "expert " << e;
    }
    // Dropless reads and writes no loads.
    if (policy != 2) {
      EXPECT_EQ(got.carried_out, cpu_loads);
    }
  }
}

}  // namespace
}  // namespace switchserve::simt_test
