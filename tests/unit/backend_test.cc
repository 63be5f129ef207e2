// The Backend contract, checked on every backend (BackendsUnderTest()) and
// every architecture variant: incremental decoding and chunked prefill equal
// one full pass, a mixed batch equals its sequences alone (dropless),
// capacity statistics agree with the trace, malformed steps are rejected with
// the cache untouched, and sampling is the host sampler's.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "engine/moe/routing_stats.h"
#include "engine/runtime/kv_cache.h"
#include "gtest/gtest.h"
#include "tests/util/backend_harness.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::AllVariantConfigs;
using testing::BackendUnderTest;
using testing::NamedConfig;
using testing::RandomWeights;

using testing::RandomTokens;
using testing::RelError;
using testing::Slice;

constexpr int kNumBlocks = testing::kHarnessNumBlocks;
constexpr int kBlockSize = testing::kHarnessBlockSize;

using Harness = testing::BackendHarness;

// Parameter: (backend, model variant).
class BackendTest : public ::testing::TestWithParam<std::tuple<BackendUnderTest, NamedConfig>> {
 protected:
  const BackendUnderTest& backend() const { return std::get<0>(GetParam()); }
  const ModelConfig& config() const { return std::get<1>(GetParam()).config; }
};

// (a) Decoding token by token through the paged cache, and prefilling in two
// chunks, equal one prefill of all tokens.
TEST_P(BackendTest, DecodeAndChunkedPrefillMatchPrefill) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 7);
  // 19 tokens: the full prefill and both chunks (8 + 11) attend tile by tile,
  // the decode steps token by token.
  const int n = 19, V = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(n, V, 3);

  Harness full(backend(), config, weights, config.dispatch);
  const std::vector<float> reference = full.Run(1, tokens, 0);
  ASSERT_EQ(reference.size(), static_cast<size_t>(n) * V);

  Harness decode(backend(), config, weights, config.dispatch);
  for (int i = 0; i < n; ++i) {
    const std::vector<float> row = decode.Run(1, {tokens[i]}, i);
    EXPECT_LE(RelError(row, Slice(reference, i, V)), 1e-4) << "position " << i;
  }

  Harness chunked(backend(), config, weights, config.dispatch);
  const int split = 8;
  std::vector<float> got =
      chunked.Run(1, std::vector<int32_t>(tokens.begin(), tokens.begin() + split), 0);
  const std::vector<float> rest =
      chunked.Run(1, std::vector<int32_t>(tokens.begin() + split, tokens.end()), split);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_LE(RelError(got, reference), 1e-4);
}

// (b) A batch mixing prefill chunks and decodes equals each sequence alone
// (dropless dispatch).
TEST_P(BackendTest, MixedBatchMatchesSequencesAlone) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 11);
  const int V = config.vocab_size;
  const auto a = RandomTokens(5, V, 21), b = RandomTokens(4, V, 22), c = RandomTokens(6, V, 23);

  Harness batched(backend(), config, weights, config.dispatch);
  StepOutput out;
  // Step 1: b's first 3 tokens and c's first 2, together.
  ASSERT_TRUE(batched
                  .Step({{2, {b.begin(), b.begin() + 3}, 0, LogitsMode::kNone},
                         {3, {c.begin(), c.begin() + 2}, 0, LogitsMode::kNone}},
                        &out)
                  .ok());
  EXPECT_TRUE(out.logits.empty());
  // Step 2: a's prefill, b's decode, c's second chunk.
  ASSERT_TRUE(batched
                  .Step({{1, a, 0, LogitsMode::kAll},
                         {2, {b[3]}, 3, LogitsMode::kLast},
                         {3, {c.begin() + 2, c.end()}, 2, LogitsMode::kLast}},
                        &out)
                  .ok());
  ASSERT_EQ(out.row_sequence.size(), 5u + 1 + 1);
  EXPECT_EQ(out.row_sequence[5], 1);
  EXPECT_EQ(out.row_position[5], 3);
  EXPECT_EQ(out.row_sequence[6], 2);
  EXPECT_EQ(out.row_position[6], 5);

  Harness alone(backend(), config, weights, config.dispatch);
  const std::vector<float> ra = alone.Run(1, a, 0);
  alone.Run(2, {b.begin(), b.begin() + 3}, 0);
  const std::vector<float> rb = alone.Run(2, {b[3]}, 3);
  alone.Run(3, {c.begin(), c.begin() + 2}, 0);
  const std::vector<float> rc = alone.Run(3, {c.begin() + 2, c.end()}, 2);

  for (int i = 0; i < 5; ++i) {
    EXPECT_LE(RelError(Slice(out.logits, i, V), Slice(ra, i, V)), 1e-4) << "a row " << i;
  }
  EXPECT_LE(RelError(Slice(out.logits, 5, V), rb), 1e-4);
  EXPECT_LE(RelError(Slice(out.logits, 6, V), Slice(rc, 3, V)), 1e-4);
}

// (c) Under capacity pressure the statistics and traces are consistent.
using BackendRoutedTest = BackendTest;

TEST_P(BackendRoutedTest, CapacityStatsAreConsistent) {
  const ModelConfig& config = this->config();
  const std::vector<RouterId> routers = RouterLayout(config).routers();
  ASSERT_FALSE(routers.empty());
  const ModelWeights weights = RandomWeights(config, 5);
  for (const auto& [scope, policy] :
       {std::pair(CapacityScope::kStep, OverflowPolicy::kDrop),
        std::pair(CapacityScope::kStep, OverflowPolicy::kReroute),
        std::pair(CapacityScope::kSequence, OverflowPolicy::kDrop),
        std::pair(CapacityScope::kSequence, OverflowPolicy::kReroute)}) {
    SCOPED_TRACE(std::string(ToString(scope)) + " " + std::string(ToString(policy)));
    DispatchConfig dispatch;
    dispatch.capacity_factor = 0.5;
    dispatch.overflow = policy;
    dispatch.scope = scope;
    dispatch.capacity_group = 4;  // sequences of 9 and 7 tokens: 3 + 2 groups
    Harness h(backend(), config, weights, dispatch);
    StepOutput out;
    const auto a = RandomTokens(9, config.vocab_size, 31);
    const auto b = RandomTokens(7, config.vocab_size, 32);
    ASSERT_TRUE(
        h.Step({{1, a, 0, LogitsMode::kAll, true}, {2, b, 0, LogitsMode::kAll, true}}, &out).ok());
    const int T = 16;
    ASSERT_EQ(out.stats.routers.size(), routers.size());
    ASSERT_EQ(out.routing.size(), static_cast<size_t>(T));
    int64_t overflowed_total = 0;
    for (size_t r = 0; r < routers.size(); ++r) {
      const RouterStepStats& s = out.stats.routers[r];
      const int E = routers[r].n_experts, k = routers[r].top_k;
      EXPECT_EQ(s.tokens, T);
      // Offset of this router's choices in each TokenRouting.
      size_t offset = 0;
      for (size_t q = 0; q < r; ++q) offset += routers[q].top_k;
      std::vector<int64_t> rerouted_in(E, 0), kept_trace(E, 0);
      int64_t dropped_trace = 0;
      for (int t = 0; t < T; ++t) {
        ASSERT_GE(out.routing[t].choices.size(), offset + k);
        for (int i = 0; i < k; ++i) {
          const RouteChoice& ch = out.routing[t].choices[offset + i];
          if (ch.fate == RouteFate::kRerouted) ++rerouted_in[ch.expert];
          if (ch.fate == RouteFate::kDropped) ++dropped_trace;
          if (ch.fate != RouteFate::kDropped) ++kept_trace[ch.expert];
        }
      }
      // The slots an expert has in this step: C for the step, or C for each
      // of the sequences' 5 groups.
      const int64_t capacity = scope == CapacityScope::kStep
                                   ? dispatch.CapacityPerExpert(T, k, E)
                                   : 5 * dispatch.CapacityPerExpert(4, k, E);
      int64_t routed = 0, kept = 0, dropped = 0, rerouted = 0;
      double prob = 0;
      for (int e = 0; e < E; ++e) {
        EXPECT_EQ(s.routed[e], s.kept[e] - rerouted_in[e] + s.rerouted[e] + s.dropped[e])
            << "router " << r << " expert " << e;
        EXPECT_EQ(s.kept[e], kept_trace[e]);
        EXPECT_LE(s.kept[e], capacity);
        routed += s.routed[e];
        kept += s.kept[e];
        dropped += s.dropped[e];
        rerouted += s.rerouted[e];
        prob += s.prob_sum[e];
      }
      EXPECT_EQ(routed, static_cast<int64_t>(T) * k);
      EXPECT_EQ(kept + dropped, static_cast<int64_t>(T) * k);
      EXPECT_EQ(dropped, dropped_trace);
      if (policy == OverflowPolicy::kDrop) {
        EXPECT_EQ(rerouted, 0);
      }
      EXPECT_NEAR(prob, T, 1e-3);
      overflowed_total += dropped + rerouted;
    }
    // Drops, or reroutes where another expert has room (top-1 with reroute
    // can absorb every overflow).
    EXPECT_GT(overflowed_total, 0) << "capacity 0.5 should overflow something";
  }
}

// (d) Malformed input is rejected and leaves the cache untouched.
TEST_P(BackendTest, BadInputIsRejectedAndCacheUntouched) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 9);
  const auto prompt = RandomTokens(6, config.vocab_size, 41);
  const auto other = RandomTokens(6, config.vocab_size, 42);

  Harness clean(backend(), config, weights, config.dispatch);
  Harness probed(backend(), config, weights, config.dispatch);
  clean.Run(1, prompt, 0);
  probed.Run(1, prompt, 0);

  // Each bad step also carries a valid chunk that would overwrite sequence 1's
  // cached positions with other tokens if anything were written.
  struct BadChunk {
    std::vector<int32_t> tokens;
    int32_t start = 0;
    std::vector<int32_t> block_table;
  };
  const std::vector<int32_t> long_table(config.max_seq_len / kBlockSize + 1, 0);
  const std::vector<BadChunk> bad = {
      {{config.vocab_size}, 0, long_table},   // token outside the vocabulary
      {{1}, config.max_seq_len, long_table},  // position past max_seq_len
      {{1, 2, 3, 4, 5}, 0, {0}},              // block table too short
      {{1}, 0, {kNumBlocks + 5}},             // block outside the cache
      {{1}, 0, {}},                           // no block table
  };
  for (const BadChunk& chunk : bad) {
    StepBatch batch;
    batch.Clear(kBlockSize);
    batch.Add(other, 0, probed.alloc().BlockTable(1));
    batch.Add(chunk.tokens, chunk.start, chunk.block_table);
    StepOutput out;
    EXPECT_EQ(probed.backend().Forward(batch, &out).code(), absl::StatusCode::kInvalidArgument);
  }
  // A batch laid out for another block size, and a sample without a generator.
  StepBatch mismatched;
  mismatched.Clear(2 * kBlockSize);
  mismatched.Add(other, 0, probed.alloc().BlockTable(1));
  StepOutput out;
  EXPECT_EQ(probed.backend().Forward(mismatched, &out).code(), absl::StatusCode::kInvalidArgument);
  SamplingParams greedy;
  greedy.temperature = 0;
  StepBatch no_rng;
  no_rng.Clear(kBlockSize);
  no_rng.Add(other, 0, probed.alloc().BlockTable(1)).sample.params = &greedy;
  EXPECT_EQ(probed.backend().Forward(no_rng, &out).code(), absl::StatusCode::kInvalidArgument);

  const std::vector<float> want = clean.Run(1, {prompt[0]}, 6);
  const std::vector<float> got = probed.Run(1, {prompt[0]}, 6);
  EXPECT_EQ(got, want);
}

// (d') Under the sequence capacity scope a chunk that continues a capacity
// group must carry that group's loads, ending where the chunk starts, of the
// model's width: anything else is rejected with the cache and the loads
// untouched; a chunk that opens a group needs none.
TEST_P(BackendRoutedTest, CarriedGroupLoadsAreValidated) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 13);
  DispatchConfig dispatch;
  dispatch.scope = CapacityScope::kSequence;
  dispatch.capacity_group = 4;
  dispatch.capacity_factor = 0.5;
  const auto prompt = RandomTokens(6, config.vocab_size, 51);
  const auto more = RandomTokens(2, config.vocab_size, 52);

  Harness clean(backend(), config, weights, dispatch);
  clean.Run(1, prompt, 0);
  const std::vector<float> want = clean.Run(1, more, 6);

  Harness probed(backend(), config, weights, dispatch);
  KvBlockAllocator& alloc = probed.alloc();
  ASSERT_TRUE(alloc.Reserve(1, 8).ok());
  GroupLoads loads;
  StepBatch first;
  first.Clear(kBlockSize);
  first.Add(prompt, 0, alloc.BlockTable(1)).group_loads = &loads;
  StepOutput out;
  ASSERT_TRUE(probed.backend().Forward(first, &out).ok());
  EXPECT_EQ(loads.next_position, 6);
  const size_t width = static_cast<size_t>(RouterLayout(config).total_experts());
  ASSERT_EQ(loads.loads.size(), width);
  const GroupLoads carried = loads;

  GroupLoads stale = loads;
  stale.next_position = 5;
  GroupLoads narrow = loads;
  narrow.loads.pop_back();
  for (GroupLoads* bad : {static_cast<GroupLoads*>(nullptr), &stale, &narrow}) {
    StepBatch batch;
    batch.Clear(kBlockSize);
    batch.Add(more, 6, alloc.BlockTable(1)).group_loads = bad;
    const absl::Status status = probed.backend().Forward(batch, &out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("sequences[0]"), std::string_view::npos) << status;
    EXPECT_NE(status.message().find("capacity group"), std::string_view::npos) << status;
  }
  EXPECT_EQ(stale.next_position, 5);
  EXPECT_EQ(loads.next_position, carried.next_position);
  EXPECT_EQ(loads.loads, carried.loads);

  StepBatch good;
  good.Clear(kBlockSize);
  StepSequence& sequence = good.Add(more, 6, alloc.BlockTable(1));
  sequence.group_loads = &loads;
  sequence.logits = LogitsMode::kAll;
  ASSERT_TRUE(probed.backend().Forward(good, &out).ok());
  EXPECT_EQ(out.logits, want);
  EXPECT_EQ(loads.next_position, 8);

  // Position 8 opens a group: no loads needed.
  ASSERT_TRUE(alloc.Reserve(1, 9).ok());
  StepBatch opening;
  opening.Clear(kBlockSize);
  opening.Add({more[0]}, 8, alloc.BlockTable(1));
  EXPECT_TRUE(probed.backend().Forward(opening, &out).ok());
}

// (e) Each sampling sequence's next token is what the host sampler draws from
// the logits of its last token: the seeded generator advanced by the draws,
// the repetition penalty over the sequence's history, top-k / top-p / min-p,
// the logprobs asked for; and it carries that token's routing.
TEST_P(BackendTest, SamplesLikeTheHostSampler) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 19);
  const int V = config.vocab_size;
  const auto a = RandomTokens(7, V, 71), b = RandomTokens(5, V, 72);
  SamplingParams hot;
  hot.temperature = 0.9f;
  hot.top_k = 20;
  hot.top_p = 0.95f;
  hot.min_p = 0.01f;
  hot.repetition_penalty = 1.3f;
  hot.logprobs = 3;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.repetition_penalty = 50.0f;
  greedy.logprobs = 2;

  // b's last-token logits and routing, returned as logits.
  Harness plain(backend(), config, weights, config.dispatch);
  StepOutput want;
  ASSERT_TRUE(
      plain
          .Step({{1, a, 0, LogitsMode::kLast}, {2, b, 0, LogitsMode::kLast, /*collect=*/true}},
                &want)
          .ok());

  // b's history holds its most likely next token: the penalty must move the
  // greedy pick elsewhere.
  const std::vector<float> b_logits = Slice(want.logits, 1, V);
  std::vector<int32_t> b_history = b;
  b_history.push_back(
      static_cast<int32_t>(std::max_element(b_logits.begin(), b_logits.end()) - b_logits.begin()));

  // a samples and returns its logits; b only samples, with its routing.
  SamplerRng rng_a(5), rng_b(6);
  SamplerRng expected_rng_a(5), expected_rng_b(6);
  Harness sampling(backend(), config, weights, config.dispatch);
  StepOutput out;
  ASSERT_TRUE(
      sampling
          .Step({{1, a, 0, LogitsMode::kLast, false, {&hot, a, &rng_a}},
                 {2, b, 0, LogitsMode::kNone, /*collect=*/true, {&greedy, b_history, &rng_b}}},
                &out)
          .ok());
  ASSERT_EQ(out.samples.size(), 2u);
  ASSERT_EQ(out.logits.size(), static_cast<size_t>(V));  // a's row only

  const SampleResult expected_a = SampleToken(out.logits, hot, a, 0, hot.logprobs, expected_rng_a);
  EXPECT_EQ(out.samples[0].sequence, 0);
  EXPECT_EQ(out.samples[0].sample.token_id, expected_a.token_id);
  EXPECT_EQ(out.samples[0].sample.logprob, expected_a.logprob);
  EXPECT_EQ(out.samples[0].sample.top_logprobs, expected_a.top_logprobs);
  EXPECT_TRUE(out.samples[0].routing.choices.empty());  // a does not collect routing
  EXPECT_EQ(rng_a.Next(), expected_rng_a.Next());       // advanced by the same draws

  const SampleResult expected_b =
      SampleToken(b_logits, greedy, b_history, 0, greedy.logprobs, expected_rng_b);
  ASSERT_NE(expected_b.token_id, b_history.back());
  EXPECT_EQ(out.samples[1].sequence, 1);
  EXPECT_EQ(out.samples[1].sample.token_id, expected_b.token_id);
  EXPECT_NEAR(out.samples[1].sample.logprob, expected_b.logprob, 1e-5);
  ASSERT_EQ(out.samples[1].sample.top_logprobs.size(), 2u);
  EXPECT_EQ(out.samples[1].sample.top_logprobs[0].first, expected_b.top_logprobs[0].first);
  EXPECT_EQ(rng_b.Next(), expected_rng_b.Next());  // greedy draws nothing
  const std::vector<RouteChoice>& got = out.samples[1].routing.choices;
  const std::vector<RouteChoice>& routed = want.routing[1].choices;
  ASSERT_EQ(got.size(), routed.size());
  ASSERT_EQ(got.size(), static_cast<size_t>(RouterLayout(config).choices_per_token()));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].expert, routed[i].expert) << i;
    EXPECT_EQ(got[i].fate, routed[i].fate) << i;
    EXPECT_NEAR(got[i].gate, routed[i].gate, 1e-6) << i;
  }
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<BackendUnderTest, NamedConfig>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}
INSTANTIATE_TEST_SUITE_P(Backends, BackendTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(AllVariantConfigs())),
                         TestName);
INSTANTIATE_TEST_SUITE_P(Backends, BackendRoutedTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::RoutedVariantConfigs())),
                         TestName);

}  // namespace
}  // namespace switchserve
