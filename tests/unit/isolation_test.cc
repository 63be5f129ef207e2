// Isolation (docs/design.md, "Serving semantics"): under the sequence
// capacity scope a request's generated tokens and logprobs, and its prompt's
// logprobs, are bitwise the same alone and among 31 varied neighbours — with
// a small token budget (chunked prefill), a KV cache small enough to force
// preemption, and drop, reroute or dropless dispatch with assignments
// actually dropped — and equal to the full-pass logprobs `score` computes.
// Under the step scope the same comparison shows the dependence. Every
// backend (but the CUDA backend on the SIMT executor:
// EngineScaleBackendsUnderTest()), the built-in model.
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/sampler.h"
#include "gtest/gtest.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/engine_runs.h"

namespace switchserve {
namespace {

using testing::BackendUnderTest;
using testing::Bits;
using testing::ByteTokens;
using testing::CountFates;
using testing::DefaultModel;
using testing::EngineRunConfig;
using testing::EngineRunTotals;
using testing::FirstDifference;
using testing::RequestOutcome;
using testing::TestRequest;

constexpr int kVictimTokens = 16;

// Its prompt's logprobs too, with 5 alternatives each; presence and
// frequency penalties on what it generates, and a logit bias.
TestRequest Victim() {
  TestRequest victim = testing::GreedyRoutedRequest(
      "And God said unto Moses, Speak unto the children of Israel", kVictimTokens);
  victim.sampling.prompt_logprobs = 5;
  victim.sampling.presence_penalty = 0.4f;
  victim.sampling.frequency_penalty = 0.3f;
  victim.sampling.logit_bias = {{' ', -1.5f}, {'e', 0.75f}};
  return victim;
}

// 31 neighbours: prompts of 3 to 90 bytes, greedy and sampled, 4 to 20
// tokens generated, some with their prompts' logprobs, some with a penalty
// and a logit bias.
std::vector<TestRequest> Neighbours() {
  const std::vector<std::string> texts = {
      "In the beginning",
      "Blessed are the meek: for they shall inherit the earth.",
      "abc",
      "And it came to pass in those days, that there went out a decree from Caesar Augustus",
      "The LORD is my shepherd; I shall not want.",
      "zzzzzzzzzzzzzzzzzzzz",
      "1234567890 1234567890 1234567890",
      "For God so loved the world,",
  };
  std::vector<TestRequest> neighbours;
  for (int i = 0; i < 31; ++i) {
    TestRequest r;
    std::string text = texts[i % texts.size()];
    if (i >= static_cast<int>(texts.size())) text = absl::StrCat(text, " ", i * 7919);
    r.prompt = ByteTokens(text);
    r.sampling.max_new_tokens = 4 + (i * 5) % 17;
    r.sampling.ignore_eos = true;
    if (i % 3 == 0) {
      r.sampling.temperature = 0;
    } else {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 1000 + i;
    }
    r.sampling.logprobs = i % 4;
    if (i % 7 == 1) {
      r.sampling.frequency_penalty = -0.5f;
      r.sampling.logit_bias = {{'a', 2.0f}};
    }
    // Every fifth one asks for its prompt's logprobs: its steps return every
    // position's logits.
    if (i % 5 == 4) r.sampling.prompt_logprobs = i % 3;
    neighbours.push_back(std::move(r));
  }
  return neighbours;
}

// The neighbours with the victim at `index`.
std::vector<TestRequest> Crowd(size_t index) {
  std::vector<TestRequest> requests = Neighbours();
  requests.insert(requests.begin() + index, Victim());
  return requests;
}

// How the engine is squeezed: a small token budget (prefill in chunks) and a
// cache too small for the requests that run at once (preemption and
// recompute). Requests hold up to ~100 tokens each.
struct EngineShape {
  std::string name;
  int64_t max_batch_tokens = 0;
  int64_t kv_cache_tokens = 0;
  int min_sequences_per_step = 0;  // the crowd really shares steps
};
inline void PrintTo(const EngineShape& shape, std::ostream* os) { *os << shape.name; }

// Steps of at most 4 tokens, 32 blocks of 4 tokens.
const EngineShape kSmallSteps = {"small_steps", 4, 128, 3};
// Steps of up to 24 tokens (prompt chunks of many rows, several query rows
// per attention tile), 64 blocks of 4 tokens.
const EngineShape kChunkedSteps = {"chunked_steps", 24, 256, 6};

EngineRunConfig Tight(const EngineShape& shape, const DispatchConfig& dispatch) {
  EngineRunConfig config;
  config.dispatch = dispatch;
  config.max_batch_tokens = shape.max_batch_tokens;
  config.max_running_requests = 32;
  config.block_size = 4;
  config.kv_cache_tokens = shape.kv_cache_tokens;
  return config;
}

DispatchConfig Dispatch(CapacityScope scope, double factor, OverflowPolicy overflow) {
  DispatchConfig dispatch;
  dispatch.scope = scope;
  dispatch.capacity_group = 16;
  dispatch.capacity_factor = factor;
  dispatch.min_capacity = 0;
  dispatch.overflow = overflow;
  return dispatch;
}

// Parameter: (backend, engine shape).
class IsolationTest : public ::testing::TestWithParam<std::tuple<BackendUnderTest, EngineShape>> {
 protected:
  const BackendUnderTest& backend() const { return std::get<0>(GetParam()); }
  const EngineShape& shape() const { return std::get<1>(GetParam()); }

  RequestOutcome Alone(const DispatchConfig& dispatch) const {
    std::vector<RequestOutcome> outcome =
        testing::RunEngine(backend(), DefaultModel(), Tight(shape(), dispatch), {Victim()});
    EXPECT_EQ(outcome.size(), 1u);
    if (outcome.empty()) return {};
    EXPECT_TRUE(outcome[0].status.ok()) << outcome[0].status;
    EXPECT_EQ(outcome[0].tokens.size(), static_cast<size_t>(kVictimTokens));
    return outcome[0];
  }

  // The victim's outcome at `index` among the neighbours; the run's totals.
  RequestOutcome Crowded(const DispatchConfig& dispatch, size_t index,
                         EngineRunTotals* totals) const {
    std::vector<RequestOutcome> outcomes = testing::RunEngine(
        backend(), DefaultModel(), Tight(shape(), dispatch), Crowd(index), totals);
    EXPECT_EQ(outcomes.size(), 32u);
    if (outcomes.size() != 32u) return {};
    for (const RequestOutcome& outcome : outcomes) EXPECT_TRUE(outcome.status.ok());
    return outcomes[index];
  }

  // The victim's tokens and logprobs are those of one full pass over its
  // prompt and generated tokens (what `score` computes), bit for bit.
  void ExpectFullPassLogprobs(const DispatchConfig& dispatch, const RequestOutcome& run) const {
    const TestRequest victim = Victim();
    std::vector<int32_t> tokens = victim.prompt;
    for (const GeneratedTokenInfo& t : run.tokens) tokens.push_back(t.token_id);
    tokens.pop_back();  // the last token is predicted, not input
    const std::vector<float> logits =
        testing::FullPassLogits(backend(), DefaultModel(), dispatch, tokens);
    const int vocab = DefaultModel().config.vocab_size;
    ASSERT_EQ(logits.size(), tokens.size() * vocab);
    SamplerRng rng(0);
    for (size_t i = 0; i < run.tokens.size(); ++i) {
      const size_t row = victim.prompt.size() - 1 + i;
      const std::vector<int32_t> history(tokens.begin(), tokens.begin() + row + 1);
      const SampleResult want = SampleToken(
          absl::MakeConstSpan(logits).subspan(row * vocab, vocab), victim.sampling, history,
          static_cast<int64_t>(victim.prompt.size()), victim.sampling.logprobs, rng);
      EXPECT_EQ(run.tokens[i].token_id, want.token_id) << "token " << i;
      EXPECT_EQ(Bits(run.tokens[i].logprob), Bits(want.logprob))
          << "token " << i << ": " << run.tokens[i].logprob << " vs full pass " << want.logprob;
    }
    // The prompt's tokens after the first, each scored by the row before it.
    ASSERT_EQ(run.prompt_logprobs.size(), victim.prompt.size() - 1);
    for (size_t i = 0; i + 1 < victim.prompt.size(); ++i) {
      const SampleResult want =
          TokenLogprobs(absl::MakeConstSpan(logits).subspan(i * vocab, vocab), victim.prompt[i + 1],
                        victim.sampling.prompt_logprobs);
      const GeneratedTokenInfo& got = run.prompt_logprobs[i];
      EXPECT_EQ(got.token_id, victim.prompt[i + 1]) << "prompt token " << i + 1;
      EXPECT_EQ(Bits(got.logprob), Bits(want.logprob))
          << "prompt token " << i + 1 << ": " << got.logprob << " vs full pass " << want.logprob;
      EXPECT_EQ(got.top_logprobs, want.top_logprobs) << "prompt token " << i + 1;
    }
  }
};

// Drop, reroute and dropless under the sequence scope: the victim alone, then
// first, in the middle and last (the newest, preempted first) of 32.
TEST_P(IsolationTest, SequenceScopeOutputDoesNotDependOnNeighbours) {
  for (const auto& [name, dispatch] :
       {std::pair("drop", Dispatch(CapacityScope::kSequence, 1.0, OverflowPolicy::kDrop)),
        std::pair("reroute", Dispatch(CapacityScope::kSequence, 1.0, OverflowPolicy::kReroute)),
        std::pair("dropless", Dispatch(CapacityScope::kSequence, 0.0, OverflowPolicy::kDrop))}) {
    SCOPED_TRACE(name);
    const RequestOutcome alone = Alone(dispatch);
    const testing::FateCounts fates = CountFates(alone.tokens);
    if (!dispatch.Dropless()) {
      EXPECT_GT(fates.dropped, 0) << "the victim's own assignments are dropped";
    }
    if (dispatch.overflow == OverflowPolicy::kReroute && !dispatch.Dropless()) {
      EXPECT_GT(fates.rerouted, 0);
    }
    int64_t preemptions = 0;
    for (size_t index : {size_t{0}, size_t{13}, size_t{31}}) {
      EngineRunTotals totals;
      const RequestOutcome crowded = Crowded(dispatch, index, &totals);
      EXPECT_EQ(FirstDifference(alone, crowded), "") << "victim at " << index;
      EXPECT_GE(totals.max_sequences_per_step, shape().min_sequences_per_step);
      if (!dispatch.Dropless()) {
        EXPECT_GT(totals.dropped, 0);
      }
      preemptions += totals.preemptions;
    }
    EXPECT_GT(preemptions, 0) << "the cache is small enough to preempt";
  }
}

// A request that asks for no logprobs reports none (0), whatever its
// neighbours ask for: the sampler's log-softmax follows the request's own
// parameters only.
TEST_P(IsolationTest, ARequestWithoutLogprobsGetsNoneWhateverItsNeighboursAsk) {
  const DispatchConfig dispatch = Dispatch(CapacityScope::kSequence, 0.0, OverflowPolicy::kDrop);
  const TestRequest quiet = Neighbours()[0];
  ASSERT_EQ(quiet.sampling.logprobs, 0);
  const std::vector<RequestOutcome> alone =
      testing::RunEngine(backend(), DefaultModel(), Tight(shape(), dispatch), {quiet});
  ASSERT_EQ(alone.size(), 1u);
  for (const GeneratedTokenInfo& token : alone[0].tokens) EXPECT_EQ(Bits(token.logprob), 0u);
  EngineRunTotals totals;
  const std::vector<RequestOutcome> crowded =
      testing::RunEngine(backend(), DefaultModel(), Tight(shape(), dispatch), Crowd(13), &totals);
  ASSERT_EQ(crowded.size(), 32u);
  EXPECT_EQ(FirstDifference(alone[0], crowded[0]), "");
}

// The same requests under the step scope: the victim's output changes with
// its neighbours.
TEST_P(IsolationTest, StepScopeOutputDependsOnNeighbours) {
  const DispatchConfig dispatch = Dispatch(CapacityScope::kStep, 1.0, OverflowPolicy::kDrop);
  const RequestOutcome alone = Alone(dispatch);
  int differing = 0;
  for (size_t index : {size_t{0}, size_t{13}, size_t{31}}) {
    EngineRunTotals totals;
    const RequestOutcome crowded = Crowded(dispatch, index, &totals);
    differing += !FirstDifference(alone, crowded).empty();
  }
  EXPECT_EQ(differing, 3);
}

// The generated tokens' logprobs are those of `score`'s full pass, under each
// policy.
using FullPassTest = IsolationTest;

TEST_P(FullPassTest, LogprobsEqualTheFullPass) {
  for (const DispatchConfig& dispatch :
       {Dispatch(CapacityScope::kSequence, 1.0, OverflowPolicy::kDrop),
        Dispatch(CapacityScope::kSequence, 1.0, OverflowPolicy::kReroute),
        Dispatch(CapacityScope::kSequence, 0.0, OverflowPolicy::kDrop)}) {
    SCOPED_TRACE(std::string(ToString(dispatch.overflow)) +
                 (dispatch.Dropless() ? " dropless" : ""));
    EngineRunTotals totals;
    const RequestOutcome crowded = Crowded(dispatch, 31, &totals);
    ExpectFullPassLogprobs(dispatch, crowded);
  }
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<BackendUnderTest, EngineShape>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}
// Steps of at most 4 tokens, and longer prompt chunks among neighbours: the
// CPU backend's kernels fix every element's reduction order whatever the
// step holds (kernels/cpu/matmul.h, paged_attention.h).
INSTANTIATE_TEST_SUITE_P(
    SmallSteps, IsolationTest,
    ::testing::Combine(::testing::ValuesIn(testing::EngineScaleBackendsUnderTest()),
                       ::testing::Values(kSmallSteps)),
    TestName);
INSTANTIATE_TEST_SUITE_P(
    ChunkedSteps, IsolationTest,
    ::testing::Combine(::testing::ValuesIn(testing::EngineScaleBackendsUnderTest()),
                       ::testing::Values(kChunkedSteps)),
    TestName);
// The CPU backend with its KV cache in bf16.
INSTANTIATE_TEST_SUITE_P(Bf16KvCache, IsolationTest,
                         ::testing::Combine(::testing::Values(testing::CpuBf16KvCacheBackend()),
                                            ::testing::Values(kSmallSteps, kChunkedSteps)),
                         TestName);
// `score`'s full pass runs a whole sequence as one chunk: the engine's steps,
// however they chunk it, give its logits bit for bit.
INSTANTIATE_TEST_SUITE_P(
    AnySteps, FullPassTest,
    ::testing::Combine(::testing::ValuesIn(testing::EngineScaleBackendsUnderTest()),
                       ::testing::Values(kSmallSteps, kChunkedSteps)),
    TestName);

}  // namespace
}  // namespace switchserve
