// Prefix caching (engine/runtime/kv_cache.h) changes what a step computes,
// never a logit: requests that start from blocks earlier requests computed
// give, bit for bit, the tokens, logprobs, alternatives and routing they give
// on a fresh engine without the cache. Every backend (but the CUDA backend on
// the SIMT executor: EngineScaleBackendsUnderTest()), the built-in model,
// capacity groups of 16 positions with assignments dropped or rerouted, so a
// prefix that ends inside a group must bring the group's loads.
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/model_loader.h"
#include "gtest/gtest.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/engine_runs.h"

namespace switchserve {
namespace {

using testing::BackendUnderTest;
using testing::ByteTokens;
using testing::DefaultModel;
using testing::EngineRunConfig;
using testing::EngineRunTotals;
using testing::FirstDifference;
using testing::GreedyRoutedRequest;
using testing::RequestOutcome;
using testing::TestRequest;

constexpr int kGroup = 16;

DispatchConfig Dispatch(OverflowPolicy overflow) {
  DispatchConfig dispatch;
  dispatch.scope = CapacityScope::kSequence;
  dispatch.capacity_group = kGroup;
  dispatch.capacity_factor = 1.0;
  dispatch.min_capacity = 0;
  dispatch.overflow = overflow;
  return dispatch;
}

// How the engine runs: the step's token budget (prefill chunks end at its
// multiples) and the cache's size (a small one evicts cached blocks).
struct EngineShape {
  std::string name;
  int64_t max_batch_tokens = 0;
  int64_t kv_cache_tokens = 0;
};
inline void PrintTo(const EngineShape& shape, std::ostream* os) { *os << shape.name; }

// Blocks of 4 tokens; one request at a time, so each finds what the ones
// before it left in the cache.
EngineRunConfig Config(const EngineShape& shape, const DispatchConfig& dispatch,
                       bool prefix_caching) {
  EngineRunConfig config;
  config.dispatch = dispatch;
  config.max_batch_tokens = shape.max_batch_tokens;
  config.max_running_requests = 1;
  config.block_size = 4;
  config.kv_cache_tokens = shape.kv_cache_tokens;
  config.prefix_caching = prefix_caching;
  return config;
}

RequestOutcome Alone(const BackendUnderTest& backend, const EngineShape& shape,
                     const DispatchConfig& dispatch, const TestRequest& request) {
  std::vector<RequestOutcome> outcome = testing::RunEngine(
      backend, DefaultModel(), Config(shape, dispatch, /*prefix_caching=*/false), {request});
  EXPECT_EQ(outcome.size(), 1u);
  if (outcome.empty()) return {};
  EXPECT_TRUE(outcome[0].status.ok()) << outcome[0].status;
  EXPECT_EQ(outcome[0].cached_prompt_tokens, 0);
  return outcome[0];
}

class PrefixCacheTest : public ::testing::TestWithParam<std::tuple<BackendUnderTest, EngineShape>> {
 protected:
  const BackendUnderTest& backend() const { return std::get<0>(GetParam()); }
  const EngineShape& shape() const { return std::get<1>(GetParam()); }

  RequestOutcome Alone(const DispatchConfig& dispatch, const TestRequest& request) const {
    return switchserve::Alone(backend(), shape(), dispatch, request);
  }
};

// A conversation: a first request; the next turn (its prompt, its answer and
// more), which finds blocks its decode steps filled; a prompt that shares
// only the first 30 tokens; the first prompt again asking for its prompt's
// logprobs (which must compute every position, so it takes nothing from the
// cache); the first request again (all but its last token cached); another
// prompt sharing the same 30 tokens, which finds all their whole blocks.
TEST_P(PrefixCacheTest, RequestsFromCachedPrefixesGiveTheSameBits) {
  for (OverflowPolicy overflow : {OverflowPolicy::kDrop, OverflowPolicy::kReroute}) {
    SCOPED_TRACE(std::string(ToString(overflow)));
    const DispatchConfig dispatch = Dispatch(overflow);
    const TestRequest first = GreedyRoutedRequest(
        "And God said unto Moses, Speak unto the children of Israel, that they", 16);
    const RequestOutcome first_alone = Alone(dispatch, first);

    TestRequest next = first;
    for (const GeneratedTokenInfo& token : first_alone.tokens) {
      next.prompt.push_back(token.token_id);
    }
    for (int32_t token : ByteTokens(". And he said")) next.prompt.push_back(token);
    next.sampling.max_new_tokens = 12;

    TestRequest shared = first;
    shared.prompt.resize(30);
    for (int32_t token : ByteTokens(" of the LORD, and of Aaron")) shared.prompt.push_back(token);

    // The same 30 tokens again: the request before it ended its first chunk
    // with the cached chain (28 tokens, 7 blocks), so this one takes all 7.
    TestRequest shared_again = first;
    shared_again.prompt.resize(30);
    for (int32_t token : ByteTokens(" and of the elders")) shared_again.prompt.push_back(token);

    TestRequest scored = first;
    scored.sampling.prompt_logprobs = 3;

    const std::vector<TestRequest> requests = {first, next, shared, scored, first, shared_again};
    std::vector<RequestOutcome> alone;
    for (const TestRequest& request : requests) alone.push_back(Alone(dispatch, request));

    EngineRunTotals totals;
    const std::vector<RequestOutcome> cached =
        testing::RunEngine(backend(), DefaultModel(),
                           Config(shape(), dispatch, /*prefix_caching=*/true), requests, &totals);
    ASSERT_EQ(cached.size(), requests.size());
    bool inside_a_group = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_TRUE(cached[i].status.ok()) << cached[i].status;
      EXPECT_EQ(FirstDifference(alone[i], cached[i]), "");
      inside_a_group |= cached[i].cached_prompt_tokens % kGroup != 0;
    }
    EXPECT_EQ(cached[0].cached_prompt_tokens, 0);
    // The next turn finds its prompt's first part and blocks of the answer.
    EXPECT_GT(cached[1].cached_prompt_tokens, static_cast<int>(first.prompt.size()));
    EXPECT_GT(cached[2].cached_prompt_tokens, 0);
    EXPECT_LE(cached[2].cached_prompt_tokens, 30);
    EXPECT_EQ(cached[3].cached_prompt_tokens, 0);
    EXPECT_GT(cached[4].cached_prompt_tokens, 0);
    EXPECT_LT(cached[4].cached_prompt_tokens, static_cast<int>(first.prompt.size()));
    // (A cache that evicts may have dropped part of the chain by then.)
    if (shape().kv_cache_tokens >= 4096) {
      EXPECT_EQ(cached[5].cached_prompt_tokens, 28);
    } else {
      EXPECT_LE(cached[5].cached_prompt_tokens, 28);
    }
    EXPECT_TRUE(inside_a_group) << "some prefix ends inside a capacity group";
    EXPECT_GT(totals.dropped, 0);
    // Cached tokens are not computed.
    int64_t prompt_tokens = 0, cached_tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
      cached_tokens += cached[i].cached_prompt_tokens;
    }
    EXPECT_EQ(totals.prefix_hit_tokens, cached_tokens);
    EXPECT_EQ(totals.prefix_query_tokens,
              prompt_tokens - static_cast<int64_t>(scored.prompt.size()));
    EXPECT_EQ(totals.prefill_tokens, prompt_tokens - cached_tokens);
  }
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<BackendUnderTest, EngineShape>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}

// Steps of 4 tokens (every block ends a chunk) and of 24 (chunk ends inside
// groups and between them); a cache of 4096 tokens, and one of 32 blocks,
// which evicts what the earlier requests left (the conversation holds up to
// 115 tokens at once).
INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefixCacheTest,
    ::testing::Combine(::testing::ValuesIn(testing::EngineScaleBackendsUnderTest()),
                       ::testing::Values(EngineShape{"small_steps", 4, 4096},
                                         EngineShape{"chunked_steps", 24, 4096},
                                         EngineShape{"small_cache", 24, 128})),
    TestName);

// Requests behind one prefix that arrive together (a request's n choices, a
// burst behind one system prompt), in steps large enough for all of them: the
// first computes the prefix, the others wait until its blocks are cached and
// start after them, with the same bits as alone: every shared whole block,
// 28 of 30 tokens. With capacity groups (of 16) the first one's first chunk
// ends at 28, inside a group, so that its step records the group's loads
// there.
class ArrivingTogetherTest : public ::testing::TestWithParam<BackendUnderTest> {};

TEST_P(ArrivingTogetherTest, RequestsBehindOnePrefixComputeItOnce) {
  const EngineShape shape{"together", 256, 4096};
  DispatchConfig dropless = Dispatch(OverflowPolicy::kDrop);
  dropless.capacity_factor = 0;
  for (const DispatchConfig& dispatch :
       {Dispatch(OverflowPolicy::kDrop), Dispatch(OverflowPolicy::kReroute), dropless}) {
    SCOPED_TRACE(dispatch.CarriesGroupLoads() ? std::string(ToString(dispatch.overflow))
                                              : "dropless");
    std::vector<TestRequest> requests;
    for (const char* tail : {" of the LORD", " and of Aaron", ", saying", " in the wilderness"}) {
      TestRequest request = GreedyRoutedRequest(
          "And God said unto Moses, Speak unto the children of Israel, that they", 6);
      request.prompt.resize(30);
      for (int32_t token : ByteTokens(tail)) request.prompt.push_back(token);
      requests.push_back(request);
    }
    EngineRunConfig config = Config(shape, dispatch, /*prefix_caching=*/true);
    config.max_running_requests = 8;
    EngineRunTotals totals;
    const std::vector<RequestOutcome> cached =
        testing::RunEngine(GetParam(), DefaultModel(), config, requests, &totals);
    ASSERT_EQ(cached.size(), requests.size());
    int64_t prompt_tokens = 0, cached_tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_TRUE(cached[i].status.ok()) << cached[i].status;
      EXPECT_EQ(FirstDifference(Alone(GetParam(), shape, dispatch, requests[i]), cached[i]), "");
      EXPECT_EQ(cached[i].cached_prompt_tokens, i == 0 ? 0 : 28);
      prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
      cached_tokens += cached[i].cached_prompt_tokens;
    }
    EXPECT_EQ(totals.prefill_tokens, prompt_tokens - cached_tokens);
  }
}

std::string BackendName(const ::testing::TestParamInfo<BackendUnderTest>& param) {
  return param.param.name;
}
INSTANTIATE_TEST_SUITE_P(Backends, ArrivingTogetherTest,
                         ::testing::ValuesIn(testing::EngineScaleBackendsUnderTest()), BackendName);

}  // namespace
}  // namespace switchserve
