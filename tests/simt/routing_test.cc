// Router top-k and step-scope capacity dispatch kernels against the CPU's
// RouteTokens and DispatchTokens (engine/moe/expert_dispatch.h): the same
// decisions, slots and statistics, ties included, for drop, reroute and
// dropless, on odd sizes, under every thread order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/moe/expert_dispatch.h"
#include "kernels/cuda/dispatch_plan.h"
#include "kernels/cuda/route_topk.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using cuda::DispatchMode;
using cuda::GateType;

// Logits for `tokens` x `experts` with row stride ld. `tied` draws them from
// a few values, so that top-k and reroute meet many exact ties.
std::vector<float> Logits(int tokens, int experts, int ld, bool tied, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::uniform_int_distribution<int> level(-4, 4);
  std::vector<float> z(static_cast<size_t>(tokens) * ld, 0.0f);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e) {
      z[static_cast<size_t>(t) * ld + e] =
          tied ? 0.5f * static_cast<float>(level(rng)) : uniform(rng);
    }
  }
  return z;
}

// How far a gate may be from RouteTokens', in units in the last place. On the
// executor the kernel's arithmetic is the host's (the same sums, std::exp):
// 2 bounds it with room. On a GPU the sigmoid's expf has up to 2 ulp of error
// (CUDA's documented bound; the host's is under 1) before 1 + e and the
// division round: 4 bounds the two results' distance (3 measured on an H100).
#if defined(SWITCHSERVE_SIMT_EMULATION)
constexpr int kGateUlps = 2;
#else
constexpr int kGateUlps = 4;
#endif

// Distance in units in the last place between two finite floats.
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

GateFunction CpuGate(GateType gate) {
  return gate == GateType::kSoftmax   ? GateFunction::kSoftmax
         : gate == GateType::kSigmoid ? GateFunction::kSigmoid
                                      : GateFunction::kSoftmaxTopK;
}

struct RouteResult {
  std::vector<int32_t> expert;
  std::vector<float> weight, prob;
};

RouteResult RouteOnDevice(const std::vector<float>& logits, int ld, int tokens, int experts,
                          int top_k, GateType gate, bool renormalize) {
  return std::make_from_tuple<RouteResult>(InEveryOrder([&] {
    DeviceArray<float> d_logits(logits), d_weight(static_cast<size_t>(tokens) * top_k),
        d_prob(static_cast<size_t>(tokens) * experts);
    DeviceArray<int32_t> d_expert(static_cast<size_t>(tokens) * top_k);
    EXPECT_EQ(cuda::LaunchRouteTopK(d_logits.get(), ld, tokens, experts, top_k, gate, renormalize,
                                    d_expert.get(), d_weight.get(), d_prob.get(), nullptr),
              cudaSuccess);
    return std::make_tuple(d_expert.Download(), d_weight.Download(), d_prob.Download());
  }));
}

TEST(SimtRouteTopK, MatchesRouteTokensTiesIncluded) {
  SIMT_REQUIRE_DEVICE();
  for (const int tokens : {1, 7, 33, 257}) {
    for (const int experts : {2, 8, 33, 64}) {
      for (const int top_k : {1, 2, 4}) {
        if (top_k > experts) continue;
        for (const GateType gate :
             {GateType::kSoftmax, GateType::kSigmoid, GateType::kSoftmaxTopK}) {
          for (const bool tied : {false, true}) {
            const bool renormalize = top_k > 1 && gate != GateType::kSoftmaxTopK;
            SCOPED_TRACE("T=" + std::to_string(tokens) + " E=" + std::to_string(experts) +
                         " k=" + std::to_string(top_k) +
                         " gate=" + std::to_string(static_cast<int>(gate)) + (tied ? " tied" : ""));
            const int ld = experts + 1;
            const std::vector<float> z = Logits(tokens, experts, ld, tied, tokens * 131 + experts);
            RouterDecision want;
            RouteTokens(z.data(), ld, tokens, experts, top_k, CpuGate(gate), renormalize, &want);
            const RouteResult got = RouteOnDevice(z, ld, tokens, experts, top_k, gate, renormalize);
            ASSERT_EQ(got.expert, want.expert);
            for (size_t i = 0; i < want.weight.size(); ++i) {
              ASSERT_LE(UlpDistance(got.weight[i], want.weight[i]), kGateUlps) << "weight " << i;
            }
            for (size_t i = 0; i < want.prob.size(); ++i) {
              ASSERT_LE(UlpDistance(got.prob[i], want.prob[i]), kGateUlps) << "prob " << i;
            }
          }
        }
      }
    }
  }
}

// A NaN logit (a NaN activation upstream) or more experts than the warp's
// per-lane masks hold: the kernel's choices are still RouteTokens', NaN
// handling included (a NaN first logit stays the best; later NaNs never win).
TEST(SimtRouteTopK, NanLogitsAndManyExpertsChooseAsRouteTokens) {
  SIMT_REQUIRE_DEVICE();
  for (const int experts : {8, 40, 1100}) {
    for (const int nan_at : {-1, 0, 3}) {
      if (nan_at < 0 && experts <= 1024) continue;
      SCOPED_TRACE("E=" + std::to_string(experts) + " NaN at " + std::to_string(nan_at));
      const int tokens = 5, top_k = 4, ld = experts;
      std::vector<float> z = Logits(tokens, experts, ld, /*tied=*/true, experts + nan_at);
      if (nan_at >= 0) {
        for (int t = 0; t < tokens; t += 2) z[static_cast<size_t>(t) * ld + nan_at] = NAN;
      }
      RouterDecision want;
      RouteTokens(z.data(), ld, tokens, experts, top_k, GateFunction::kSigmoid, true, &want);
      const RouteResult got =
          RouteOnDevice(z, ld, tokens, experts, top_k, GateType::kSigmoid, true);
      EXPECT_EQ(got.expert, want.expert);
    }
  }
}

struct PlanResult {
  std::vector<int32_t> trace_expert;
  std::vector<float> trace_gate;
  std::vector<uint8_t> trace_fate;
  std::vector<int32_t> offsets, slot_token;
  std::vector<float> slot_weight;
  std::vector<int32_t> counts;
  std::vector<double> prob_sum;
};

// Dispatches `decision` on the device; the score (logits) rows have stride
// score_ld in `scores`.
PlanResult PlanOnDevice(const RouterDecision& decision, const DispatchConfig& config) {
  const int T = decision.tokens, E = decision.n_experts, K = decision.top_k;
  const size_t assignments = static_cast<size_t>(T) * K;
  const bool dropless = config.Dropless();
  cuda::DispatchPlanInput in;
  in.tokens = T;
  in.top_k = K;
  in.n_experts = E;
  in.capacity = dropless ? 0 : config.CapacityPerExpert(T, K, E);
  in.mode = dropless                                      ? DispatchMode::kDropless
            : config.overflow == OverflowPolicy::kReroute ? DispatchMode::kReroute
                                                          : DispatchMode::kDrop;
  in.score_ld = E;
  return std::make_from_tuple<PlanResult>(InEveryOrder([&] {
    DeviceArray<int32_t> d_expert(decision.expert);
    DeviceArray<float> d_weight(decision.weight), d_score(decision.score), d_prob(decision.prob);
    DeviceArray<int32_t> trace_expert(assignments), offsets(E + 1), slot_token(assignments),
        counts(4 * E);
    DeviceArray<float> trace_gate(assignments), slot_weight(assignments);
    DeviceArray<uint8_t> trace_fate(assignments);
    DeviceArray<double> prob_sum(E);
    cuda::DispatchPlanInput input = in;
    input.expert = d_expert.get();
    input.weight = d_weight.get();
    input.score = d_score.get();
    input.prob = d_prob.get();
    const cuda::DispatchPlanOutput out{trace_expert.get(), trace_gate.get(), trace_fate.get(),
                                       offsets.get(),      slot_token.get(), slot_weight.get(),
                                       counts.get(),       prob_sum.get()};
    EXPECT_EQ(cuda::LaunchDispatchPlan(input, out, nullptr), cudaSuccess);
    std::vector<int32_t> offs = offsets.Download();
    // Slots past the total are not written: compare only the used ones.
    std::vector<int32_t> tokens = slot_token.Download();
    std::vector<float> weights = slot_weight.Download();
    tokens.resize(offs[E]);
    weights.resize(offs[E]);
    return std::make_tuple(trace_expert.Download(), trace_gate.Download(), trace_fate.Download(),
                           offs, tokens, weights, counts.Download(), prob_sum.Download());
  }));
}

// The device's dispatch of `device` against DispatchTokens of `cpu` (the same
// decision unless the device routed it too): everything identical, the gate
// weights within `gate_ulps`.
void ExpectSamePlan(const RouterDecision& cpu, const RouterDecision& device,
                    const DispatchConfig& config, int gate_ulps = 0) {
  ExpertAssignments want;
  RouterStepStats stats;
  stats.Reset(cpu.n_experts);
  DispatchTokens(cpu, config, /*groups=*/nullptr, &want, &stats);
  const PlanResult got = PlanOnDevice(device, config);
  const int E = cpu.n_experts;
  for (size_t a = 0; a < want.trace.size(); ++a) {
    ASSERT_EQ(got.trace_expert[a], want.trace[a].expert) << "assignment " << a;
    ASSERT_LE(UlpDistance(got.trace_gate[a], want.trace[a].gate), gate_ulps) << "assignment " << a;
    ASSERT_EQ(got.trace_fate[a], static_cast<uint8_t>(want.trace[a].fate)) << "assignment " << a;
  }
  ASSERT_EQ(got.offsets, want.offsets);
  ASSERT_EQ(got.slot_token, want.token);
  ASSERT_EQ(got.slot_weight.size(), want.weight.size());
  for (size_t i = 0; i < want.weight.size(); ++i) {
    ASSERT_LE(UlpDistance(got.slot_weight[i], want.weight[i]), gate_ulps) << "slot " << i;
  }
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(got.counts[e], stats.routed[e]) << "routed, expert " << e;
    ASSERT_EQ(got.counts[E + e], stats.kept[e]) << "kept, expert " << e;
    ASSERT_EQ(got.counts[2 * E + e], stats.rerouted[e]) << "rerouted, expert " << e;
    ASSERT_EQ(got.counts[3 * E + e], stats.dropped[e]) << "dropped, expert " << e;
    if (gate_ulps == 0) {
      ASSERT_EQ(std::memcmp(&got.prob_sum[e], &stats.prob_sum[e], 8), 0) << "prob_sum " << e;
    } else {
      ASSERT_NEAR(got.prob_sum[e], stats.prob_sum[e], 1e-6 * stats.prob_sum[e]) << "prob_sum " << e;
    }
  }
}

DispatchConfig Config(double capacity_factor, OverflowPolicy overflow, int min_capacity = 0) {
  DispatchConfig config;
  config.capacity_factor = capacity_factor;
  config.overflow = overflow;
  config.min_capacity = min_capacity;
  config.scope = CapacityScope::kStep;  // the device plan's scope
  return config;
}

TEST(SimtDispatchPlan, MatchesDispatchTokensForDropRerouteAndDropless) {
  SIMT_REQUIRE_DEVICE();
  for (const int tokens : {1, 7, 33, 257}) {
    for (const int experts : {2, 4, 8, 32, 64}) {
      for (const int top_k : {1, 2}) {
        for (const bool tied : {false, true}) {
          RouterDecision decision;
          const std::vector<float> z =
              Logits(tokens, experts, experts, tied, 7 * tokens + experts + top_k);
          RouteTokens(z.data(), experts, tokens, experts, top_k, GateFunction::kSoftmax, false,
                      &decision);
          for (const DispatchConfig& config :
               {Config(0.0, OverflowPolicy::kDrop), Config(0.5, OverflowPolicy::kDrop),
                Config(1.25, OverflowPolicy::kDrop), Config(0.5, OverflowPolicy::kReroute),
                Config(1.25, OverflowPolicy::kReroute), Config(0.1, OverflowPolicy::kReroute, 1)}) {
            SCOPED_TRACE("T=" + std::to_string(tokens) + " E=" + std::to_string(experts) +
                         " k=" + std::to_string(top_k) + (tied ? " tied" : "") +
                         " cf=" + std::to_string(config.capacity_factor) +
                         (config.overflow == OverflowPolicy::kReroute ? " reroute" : " drop"));
            ExpectSamePlan(decision, decision, config);
          }
        }
      }
    }
  }
}

TEST(SimtDispatchPlan, RandomRoutingsMatchDispatchTokens) {
  SIMT_REQUIRE_DEVICE();
  std::mt19937_64 rng(2026);
  for (int trial = 0; trial < 40; ++trial) {
    const int experts = std::vector<int>{2, 4, 8, 32}[rng() % 4];
    const int top_k = 1 + static_cast<int>(rng() % std::min(experts, 3));
    const int tokens = 1 + static_cast<int>(rng() % 300);
    const double capacity_factor = 0.5 + 1.5 * static_cast<double>(rng() % 1000) / 1000.0;
    const OverflowPolicy overflow =
        rng() % 2 == 0 ? OverflowPolicy::kDrop : OverflowPolicy::kReroute;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": T=" + std::to_string(tokens) +
                 " E=" + std::to_string(experts) + " k=" + std::to_string(top_k) +
                 " cf=" + std::to_string(capacity_factor));
    RouterDecision decision;
    const std::vector<float> z = Logits(tokens, experts, experts, trial % 2 == 1, rng());
    RouteTokens(z.data(), experts, tokens, experts, top_k, GateFunction::kSigmoid, true, &decision);
    ExpectSamePlan(decision, decision, Config(capacity_factor, overflow));
  }
}

// A router's experts past the 48 KiB of shared memory a block gets without
// opting in (819 experts fit: 4 * (15 E + 1) bytes), up to the most the
// device's opt-in limit holds: the same plan as DispatchTokens.
TEST(SimtDispatchPlan, ExpertsPastTheDefaultSharedMemoryMatchDispatchTokens) {
  SIMT_REQUIRE_DEVICE();
  int limit = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const int most = (limit / 4 - 1) / 15;
  ASSERT_GE(most, 820) << "the device holds fewer experts than the test needs";
  for (const int experts : {820, most}) {
    const int tokens = 33, top_k = 2;
    RouterDecision decision;
    const std::vector<float> z = Logits(tokens, experts, experts, /*tied=*/true, experts);
    RouteTokens(z.data(), experts, tokens, experts, top_k, GateFunction::kSoftmax, false,
                &decision);
    for (const DispatchConfig& config :
         {Config(0.0, OverflowPolicy::kDrop), Config(0.1, OverflowPolicy::kDrop, 1),
          Config(0.1, OverflowPolicy::kReroute, 1)}) {
      SCOPED_TRACE("E=" + std::to_string(experts) +
                   " cf=" + std::to_string(config.capacity_factor) +
                   (config.overflow == OverflowPolicy::kReroute ? " reroute" : " drop"));
      ExpectSamePlan(decision, decision, config);
    }
  }
}

// Step-scope reroute where a token's router scores hold a NaN (a NaN
// activation upstream): the token's best free expert is BestExpert's, the
// first free one in index order if its score is NaN (nothing compares
// greater), else never the NaN one. NaN at the first expert, at one the
// top-k leaves free, at the last; the experts fill at capacity 1.
TEST(SimtDispatchPlan, NanScoresRerouteAsDispatchTokens) {
  SIMT_REQUIRE_DEVICE();
  for (const int experts : {8, 33}) {
    for (const int nan_at : {0, 2, experts - 1}) {
      for (const int top_k : {1, 2}) {
        SCOPED_TRACE("E=" + std::to_string(experts) + " NaN at " + std::to_string(nan_at) +
                     " k=" + std::to_string(top_k));
        const int tokens = 13;
        std::vector<float> z = Logits(tokens, experts, experts, /*tied=*/false, experts + nan_at);
        for (int t = 0; t < tokens; ++t) {
          z[static_cast<size_t>(t) * experts] = 10.0f;  // everyone's first choice
          if (t % 3 != 2) z[static_cast<size_t>(t) * experts + nan_at] = NAN;
        }
        RouterDecision decision;
        RouteTokens(z.data(), experts, tokens, experts, top_k, GateFunction::kSigmoid, false,
                    &decision);
        ExpectSamePlan(decision, decision, Config(0.01, OverflowPolicy::kReroute, 1));
      }
    }
  }
}

// Layer 1 of the GPU test plan: the same logits into the CPU's and the
// device's route + dispatch give bit-identical decisions.
TEST(SimtDispatchPlan, RouteThenDispatchOnDeviceMatchesTheCpuFromLogits) {
  SIMT_REQUIRE_DEVICE();
  const int tokens = 257, experts = 32, top_k = 2;
  for (const OverflowPolicy overflow : {OverflowPolicy::kDrop, OverflowPolicy::kReroute}) {
    const std::vector<float> z = Logits(tokens, experts, experts, true, 99);
    RouterDecision cpu;
    RouteTokens(z.data(), experts, tokens, experts, top_k, GateFunction::kSoftmax, false, &cpu);
    const RouteResult routed =
        RouteOnDevice(z, experts, tokens, experts, top_k, GateType::kSoftmax, false);
    RouterDecision device = cpu;  // score = logits; the rest from the device
    device.expert = routed.expert;
    device.weight = routed.weight;
    device.prob = routed.prob;
    ASSERT_EQ(device.expert, cpu.expert);
    // On a GPU, exp() may round gates and probabilities by an ulp or two.
    ExpectSamePlan(cpu, device, Config(1.0, overflow), kGateUlps);
  }
}

}  // namespace
}  // namespace switchserve::simt_test
