// The shared-buffer attack on MoE capacity (Hayes et al. 2024, "Buffer
// Overflow in Mixture of Experts", arXiv:2402.05526): requests built to crowd
// one expert that a victim uses. Under the default capacity scope (sequence)
// they change neither the victim's output nor its drop counts; under the step
// scope they do. The crowding inputs are found on the built-in model: the
// repeated byte whose tokens send the largest share of one router's
// assignments to an expert the victim's prompt also uses.
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/model_loader.h"
#include "engine/moe/router_layout.h"
#include "gtest/gtest.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/engine_runs.h"

namespace switchserve {
namespace {

using testing::BackendUnderTest;
using testing::ByteTokens;
using testing::CountFates;
using testing::DefaultModel;
using testing::EngineRunConfig;
using testing::RequestOutcome;
using testing::TestRequest;

constexpr int kCrowdPromptBytes = 48;

TestRequest Victim() {
  return testing::GreedyRoutedRequest("And the LORD spake unto Moses, saying,", 16);
}

// Assignments per expert of router `r` over every position of `routing`.
std::vector<int64_t> ExpertCounts(const std::vector<TokenRouting>& routing,
                                  const RouterLayout& layout, int r) {
  std::vector<int64_t> counts(layout[r].n_experts, 0);
  for (const TokenRouting& token : routing) {
    for (int i = 0; i < layout[r].top_k; ++i) {
      ++counts[token.choices[layout.ChoiceOffset(r) + i].expert];
    }
  }
  return counts;
}

struct CrowdingInput {
  unsigned char byte = 0;
  int router = -1;
  int expert = -1;
  double share = 0;  // of the crowding prompt's tokens that `router` sends to `expert`
  int64_t victim_assignments = 0;  // of the victim's prompt to `expert`
};

// The repeated byte, router and expert with the largest share, among experts
// the victim's prompt sends at least 3 assignments to (ties: the expert the
// victim uses most).
CrowdingInput FindCrowdingInput(const BackendUnderTest& backend, const DispatchConfig& dropless) {
  const Model& model = DefaultModel();
  const RouterLayout layout(model.config);
  const std::vector<TokenRouting> victim =
      testing::PromptRouting(backend, model, dropless, Victim().prompt);
  CrowdingInput best;
  for (int c = 33; c < 127; ++c) {
    const std::vector<int32_t> prompt(kCrowdPromptBytes, c);
    const std::vector<TokenRouting> routing =
        testing::PromptRouting(backend, model, dropless, prompt);
    for (int r = 0; r < static_cast<int>(layout.size()); ++r) {
      const std::vector<int64_t> mine = ExpertCounts(routing, layout, r);
      const std::vector<int64_t> theirs = ExpertCounts(victim, layout, r);
      for (int e = 0; e < layout[r].n_experts; ++e) {
        const double share = static_cast<double>(mine[e]) / kCrowdPromptBytes;
        if (theirs[e] < 3) continue;
        if (share > best.share || (share == best.share && theirs[e] > best.victim_assignments)) {
          best = {static_cast<unsigned char>(c), r, e, share, theirs[e]};
        }
      }
    }
  }
  return best;
}

// 31 crowding requests, then the victim (last in every step's order).
std::vector<TestRequest> Attack(unsigned char byte) {
  std::vector<TestRequest> requests;
  for (int i = 0; i < 31; ++i) {
    TestRequest r;
    r.prompt.assign(kCrowdPromptBytes, byte);
    r.sampling.temperature = 0;
    r.sampling.max_new_tokens = 24;
    r.sampling.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  requests.push_back(Victim());
  return requests;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

bool SameOutput(const RequestOutcome& a, const RequestOutcome& b) {
  if (a.tokens.size() != b.tokens.size()) return false;
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    if (a.tokens[i].token_id != b.tokens[i].token_id ||
        Bits(a.tokens[i].logprob) != Bits(b.tokens[i].logprob)) {
      return false;
    }
  }
  return true;
}

class AdversarialNeighbourTest : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  // The victim alone, and after the crowd, under `dispatch`. Steps of at most
  // 4 tokens: many steps for the crowd to share with the victim.
  std::pair<RequestOutcome, RequestOutcome> AloneAndAttacked(const DispatchConfig& dispatch,
                                                             unsigned char byte) const {
    EngineRunConfig config;
    config.dispatch = dispatch;
    config.max_batch_tokens = 4;
    config.max_running_requests = 32;
    config.block_size = 4;
    config.kv_cache_tokens = 32 * 80;
    const std::vector<RequestOutcome> alone =
        testing::RunEngine(GetParam(), DefaultModel(), config, {Victim()});
    const std::vector<RequestOutcome> attacked =
        testing::RunEngine(GetParam(), DefaultModel(), config, Attack(byte));
    EXPECT_EQ(alone.size(), 1u);
    EXPECT_EQ(attacked.size(), 32u);
    if (alone.size() != 1 || attacked.size() != 32) return {};
    EXPECT_TRUE(alone[0].status.ok());
    EXPECT_TRUE(attacked[31].status.ok());
    return {alone[0], attacked[31]};
  }
};

TEST_P(AdversarialNeighbourTest, CrowdingAnExpertChangesNothingUnderTheDefaultScope) {
  DispatchConfig dropless;
  dropless.capacity_factor = 0;
  const CrowdingInput crowd = FindCrowdingInput(GetParam(), dropless);
  ASSERT_GE(crowd.router, 0);
  const RouterLayout layout(DefaultModel().config);
  const RouterId& id = layout[crowd.router];
  SCOPED_TRACE(std::string("byte '") + static_cast<char>(crowd.byte) + "', layer " +
               std::to_string(id.layer) + " " + std::string(ToString(id.module)) + " head " +
               std::to_string(id.head) + " expert " + std::to_string(crowd.expert) + ", share " +
               std::to_string(crowd.share));
  // Nearly every token of the crowding prompt goes to that expert.
  EXPECT_GE(crowd.share, 0.9);

  // The default scope and group, and a capacity low enough that the victim
  // loses assignments even alone.
  DispatchConfig dispatch;
  dispatch.capacity_factor = 0.5;
  dispatch.min_capacity = 0;
  dispatch.overflow = OverflowPolicy::kDrop;
  ASSERT_EQ(dispatch.scope, CapacityScope::kSequence);
  const auto [alone, attacked] = AloneAndAttacked(dispatch, crowd.byte);
  EXPECT_GT(CountFates(alone.tokens).dropped, 0);
  EXPECT_TRUE(SameOutput(alone, attacked));
  EXPECT_EQ(CountFates(alone.tokens), CountFates(attacked.tokens));

  dispatch.scope = CapacityScope::kStep;
  const auto [step_alone, step_attacked] = AloneAndAttacked(dispatch, crowd.byte);
  EXPECT_FALSE(SameOutput(step_alone, step_attacked)) << "the attack changes the victim's output";
  EXPECT_GT(CountFates(step_attacked.tokens).dropped, CountFates(step_alone.tokens).dropped)
      << "the attack denies the victim experts";
}

std::string TestName(const ::testing::TestParamInfo<BackendUnderTest>& info) {
  return info.param.name;
}
INSTANTIATE_TEST_SUITE_P(Backends, AdversarialNeighbourTest,
                         ::testing::ValuesIn(testing::EngineScaleBackendsUnderTest()), TestName);

}  // namespace
}  // namespace switchserve
