// Capacity dispatch of one router over one step (engine/moe/expert_dispatch.h):
// the sequence scope (loads per sequence and group, carried in and out) next
// to the step scope, for a decode step (32 sequences x 1 token) and a prefill
// step (4 sequences x 512 tokens), drop and reroute, on the paper's FFN
// router (32 experts, k = 4) and an attention router (4 experts, k = 2).
// Random normal logits; capacity factor 1.0 (assignments are dropped).
// BM_Route: the routing itself, on the same logits.
//
//   build/release/bench/dispatch_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/moe/expert_dispatch.h"

namespace switchserve {
namespace {

struct StepShape {
  int sequences;
  int tokens_per_sequence;
};

void BM_Dispatch(benchmark::State& state) {
  const CapacityScope scope = state.range(0) == 0 ? CapacityScope::kStep : CapacityScope::kSequence;
  const OverflowPolicy overflow =
      state.range(1) == 0 ? OverflowPolicy::kDrop : OverflowPolicy::kReroute;
  const StepShape shape = state.range(2) == 0 ? StepShape{32, 1} : StepShape{4, 512};
  const int E = static_cast<int>(state.range(3));
  const int k = E == 32 ? 4 : 2;
  const int T = shape.sequences * shape.tokens_per_sequence;

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> logits(static_cast<size_t>(T) * E);
  for (float& z : logits) z = normal(rng);
  RouterDecision decision;
  RouteTokens(logits.data(), E, T, E, k, GateFunction::kSigmoid, false, &decision);

  DispatchConfig dispatch;
  dispatch.capacity_factor = 1.0;
  dispatch.overflow = overflow;
  dispatch.scope = scope;
  dispatch.capacity_group = 128;
  // Decode tokens sit mid-group (position 200), carrying loads; prefill
  // chunks start at position 0.
  std::vector<int32_t> sequence, position;
  for (int s = 0; s < shape.sequences; ++s) {
    for (int i = 0; i < shape.tokens_per_sequence; ++i) {
      sequence.push_back(s);
      position.push_back(shape.tokens_per_sequence == 1 ? 200 : i);
    }
  }
  std::vector<int32_t> loads(static_cast<size_t>(shape.sequences) * E, 0);
  SequenceGroups groups{sequence.data(), position.data(), loads.data(), E};
  ExpertAssignments assignments;
  RouterStepStats stats;
  for (auto _ : state) {
    std::fill(loads.begin(), loads.end(), 10);
    stats.Reset(E);
    DispatchTokens(decision, dispatch, &groups, &assignments, &stats);
    benchmark::DoNotOptimize(assignments.token.data());
  }
  state.counters["ns_per_token"] =
      benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate |
                                                     benchmark::Counter::kInvert);
  state.SetLabel(std::string(ToString(scope)) + " " + std::string(ToString(overflow)) +
                 (shape.tokens_per_sequence == 1 ? " decode 32x1" : " prefill 4x512") + " E" +
                 std::to_string(E));
}

// Args: scope (0 step, 1 sequence), overflow (0 drop, 1 reroute), step (0
// decode, 1 prefill), experts.
BENCHMARK(BM_Dispatch)->ArgsProduct({{0, 1}, {0, 1}, {0, 1}, {4, 32}});

// The routing before it (RouteTokens: sigmoid gates, top-k by logit, the
// statistics' probabilities) for 32 decode tokens and a 512-token prefill.
void BM_Route(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  const int E = static_cast<int>(state.range(1));
  const int k = E == 32 ? 4 : 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> logits(static_cast<size_t>(T) * E);
  for (float& z : logits) z = normal(rng);
  RouterDecision decision;
  for (auto _ : state) {
    RouteTokens(logits.data(), E, T, E, k, GateFunction::kSigmoid, false, &decision);
    benchmark::DoNotOptimize(decision.expert.data());
  }
  state.counters["ns_per_token"] =
      benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate |
                                                     benchmark::Counter::kInvert);
}

// Args: tokens, experts.
BENCHMARK(BM_Route)->ArgsProduct({{32, 512}, {4, 32}});

}  // namespace
}  // namespace switchserve

BENCHMARK_MAIN();
