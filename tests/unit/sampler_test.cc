#include "engine/runtime/sampler.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace switchserve {
namespace {

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  SamplerRng rng(1);
  const std::vector<float> logits = {0.1f, 3.0f, 3.0f, -1.0f};
  EXPECT_EQ(SampleToken(logits, Greedy(), {}, 0, 0, rng).token_id, 1);
}

TEST(SamplerTest, RepetitionPenaltyDemotesSeenTokens) {
  SamplerRng rng(1);
  SamplingParams p = Greedy();
  p.repetition_penalty = 2.0f;
  const std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  EXPECT_EQ(SampleToken(logits, p, {0}, 0, 0, rng).token_id, 1);  // 3/2 < 2
  const std::vector<float> negative = {-1.0f, -1.5f};
  EXPECT_EQ(SampleToken(negative, p, {0}, 0, 0, rng).token_id, 1);  // -2 < -1.5
}

// Presence and frequency penalties subtract presence + frequency * count
// from each id generated so far (after the prompt), once per distinct id.
TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  SamplerRng rng(1);
  SamplingParams p = Greedy();
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  p.presence_penalty = 0.6f;
  EXPECT_EQ(SampleToken(logits, p, {0, 0, 0}, 0, 0, rng).token_id, 0);  // 2.4 > 2
  p.presence_penalty = 1.5f;
  EXPECT_EQ(SampleToken(logits, p, {0}, 0, 0, rng).token_id, 1);  // 1.5 < 2
  // The prompt's ids are not penalised.
  EXPECT_EQ(SampleToken(logits, p, {0, 1}, 1, 0, rng).token_id, 0);  // 3 > 2 - 1.5
  EXPECT_EQ(SampleToken(logits, p, {0, 1}, 2, 0, rng).token_id, 0);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.4f;
  EXPECT_EQ(SampleToken(logits, p, {0, 0}, 0, 0, rng).token_id, 0);     // 3 - 0.8 > 2
  EXPECT_EQ(SampleToken(logits, p, {0, 0, 0}, 0, 0, rng).token_id, 1);  // 3 - 1.2 < 2
  // Negative values favour repeating.
  p.frequency_penalty = -1.1f;
  EXPECT_EQ(SampleToken(logits, p, {2, 2}, 0, 0, rng).token_id, 2);  // 1 + 2.2 > 3
  // The logprobs stay those of the raw logits.
  p.logprobs = 1;
  const SampleResult r = SampleToken(logits, p, {2, 2}, 0, 1, rng);
  EXPECT_EQ(r.top_logprobs.at(0).first, 0);
}

// A logit bias moves the listed ids' scores: -100 keeps a token from ever
// being drawn, a bias can make another the argmax.
TEST(SamplerTest, LogitBiasMovesTheListedTokens) {
  SamplerRng rng(3);
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f, -1.0f};
  SamplingParams p = Greedy();
  p.logit_bias = {{3, 3.5f}};
  EXPECT_EQ(SampleToken(logits, p, {}, 0, 0, rng).token_id, 3);
  p.temperature = 1.0f;
  p.logit_bias = {{0, -100.0f}, {1, -100.0f}};
  for (int i = 0; i < 300; ++i) {
    const int32_t token = SampleToken(logits, p, {}, 0, 0, rng).token_id;
    ASSERT_TRUE(token == 2 || token == 3) << token;
  }
}

// min_tokens: the ids it holds back get a bias of -inf while fewer tokens
// than min_tokens follow the prompt, in place of any bias the request gave
// them; then they are sampled as before.
TEST(SamplerTest, MinTokensHoldsItsIdsBackUntilEnoughAreGenerated) {
  SamplerRng rng(4);
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f, -1.0f};
  SamplingParams p = Greedy();
  p.min_tokens = 2;
  p.min_tokens_ids = {0, 3};
  p.logit_bias = {{1, -0.5f}, {3, 9.0f}};
  // A prompt of 2: 0, then 1 token generated: 0 and 3 held back, 1 biased.
  EXPECT_EQ(SampleToken(logits, p, {5, 5}, 2, 0, rng).token_id, 1);
  EXPECT_EQ(SampleToken(logits, p, {5, 5, 1}, 2, 0, rng).token_id, 1);
  EXPECT_EQ(SampleToken(logits, p, {5, 5, 1, 1}, 2, 0, rng).token_id, 3);  // 2 generated: biased 3
  p.temperature = 1.0f;
  for (int i = 0; i < 300; ++i) {
    const int32_t token = SampleToken(logits, p, {5, 5, 1}, 2, 0, rng).token_id;
    ASSERT_TRUE(token == 1 || token == 2) << token;
  }
  const std::vector<int32_t> generated = {1, 1};
  EXPECT_EQ(SampleBiases(p, absl::MakeConstSpan(generated).first(1)),
            (std::vector<std::pair<int32_t, float>>{{0, -std::numeric_limits<float>::infinity()},
                                                    {1, -0.5f},
                                                    {3, -std::numeric_limits<float>::infinity()}}));
  EXPECT_EQ(SampleBiases(p, generated), p.logit_bias);
  // The logprobs stay those of the raw logits.
  const SampleResult r = SampleToken(logits, p, {5, 5}, 2, 2, rng);
  EXPECT_EQ(r.top_logprobs.at(0).first, 0);
}

// bad_words: a word's last id is banned while the generated tokens (not the
// prompt's) end with the ids before it; a one-id word always is.
TEST(SamplerTest, BadWordsBanTheTokenThatWouldCompleteThem) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  SamplerRng rng(5);
  const std::vector<float> logits = {2.0f, 1.9f, 1.8f, 1.7f, -1.0f};
  SamplingParams p = Greedy();
  p.bad_words_ids = {{1, 2, 0}, {3}};
  p.logit_bias = {{0, 0.5f}, {4, 1.0f}};
  // Generated {1, 2}: 0 would complete the first word, 3 is the second.
  const std::vector<int32_t> history = {1, 2, 1, 2};
  EXPECT_EQ(SampleToken(logits, p, history, 2, 0, rng).token_id, 1);
  EXPECT_EQ(SampleBiases(p, absl::MakeConstSpan(history).subspan(2)),
            (std::vector<std::pair<int32_t, float>>{{0, -kInf}, {3, -kInf}, {4, 1.0f}}));
  // The same ids in the prompt do not count; nor does a partial match.
  EXPECT_EQ(SampleToken(logits, p, history, 4, 0, rng).token_id, 0);
  EXPECT_EQ(SampleToken(logits, p, {1, 2, 2, 2}, 2, 0, rng).token_id, 0);
  EXPECT_EQ(SampleBiases(p, {}),
            (std::vector<std::pair<int32_t, float>>{{0, 0.5f}, {3, -kInf}, {4, 1.0f}}));
  p.temperature = 1.0f;
  for (int i = 0; i < 300; ++i) {
    const int32_t token = SampleToken(logits, p, history, 2, 0, rng).token_id;
    ASSERT_TRUE(token == 1 || token == 2 || token == 4) << token;
  }
}

// allowed_token_ids: no other id is sampled, greedy or drawn, whatever its
// logit or bias; biases and bans still apply to the allowed ones; logprobs
// stay those of the raw logits.
TEST(SamplerTest, AllowedTokenIdsAreTheOnlyOnesSampled) {
  SamplerRng rng(6);
  const std::vector<float> logits = {5.0f, 1.0f, 0.5f, 4.0f, 0.0f};
  SamplingParams p = Greedy();
  p.allowed_token_ids = {1, 2, 4};
  p.logit_bias = {{0, 100.0f}, {4, 0.75f}};
  EXPECT_EQ(SampleToken(logits, p, {}, 0, 0, rng).token_id, 1);
  p.bad_words_ids = {{1}};
  EXPECT_EQ(SampleToken(logits, p, {}, 0, 0, rng).token_id, 4);
  const SampleResult r = SampleToken(logits, p, {}, 0, 1, rng);
  EXPECT_EQ(r.top_logprobs.at(0).first, 0);
  p.temperature = 3.0f;
  p.bad_words_ids.clear();
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) seen.insert(SampleToken(logits, p, {}, 0, 0, rng).token_id);
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2, 4}));
}

// An id scoring the lowest finite value (banned, not allowed, a logit of
// -inf) is never drawn beside a higher one, even at a temperature so high
// that exp((score - top) / temperature) would give it a weight near the
// others', nor after a repetition penalty below 1 (which multiplies
// negative scores).
TEST(SamplerTest, ExcludedIdsStayOutAtAnyTemperature) {
  SamplerRng rng(8);
  const std::vector<float> logits = {0.0f, 1.0f, -std::numeric_limits<float>::infinity(), 0.5f,
                                     2.0f};
  SamplingParams p;
  p.temperature = std::numeric_limits<float>::max();
  p.allowed_token_ids = {1, 2, 3, 4};
  p.min_tokens = 1;
  p.min_tokens_ids = {4};
  // A repetition penalty below 1 does not lift them back (0, 2 and 4 in
  // the prompt).
  p.repetition_penalty = 0.01f;
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) {
    seen.insert(SampleToken(logits, p, {0, 2, 4}, 3, 0, rng).token_id);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
  p.temperature = 0.0f;
  // Greedy: the penalised 0 (not allowed) would reach -3.4e36.
  EXPECT_EQ(SampleToken({0.0f, -1e38f, -3e38f}, p, {0}, 1, 0, rng).token_id, 1);
}

// A prompt token's score: its logprob and rank (1 + the ids with a higher
// logit, ties not counted; NaN lowest) and the most likely alternatives.
TEST(SamplerTest, TokenLogprobsRankTheToken) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, nan};
  EXPECT_EQ(TokenLogprobs(logits, 1, 0).rank, 1);
  EXPECT_EQ(TokenLogprobs(logits, 3, 0).rank, 1);
  EXPECT_EQ(TokenLogprobs(logits, 2, 0).rank, 3);
  EXPECT_EQ(TokenLogprobs(logits, 4, 0).rank, 5);
  const SampleResult r = TokenLogprobs(logits, 0, 2);
  EXPECT_EQ(r.rank, 4);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 3);
  EXPECT_NEAR(r.logprob, r.top_logprobs[0].second - 2.0f, 1e-6);
}

TEST(SamplerTest, SameSeedSameTokens) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  SamplingParams p;
  p.temperature = 1.0f;
  auto draw = [&](uint64_t seed) {
    SamplerRng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(SampleToken(logits, p, {}, 0, 0, rng).token_id);
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(SamplerTest, TopKKeepsOnlyKBest) {
  const std::vector<float> logits = {1.0f, 5.0f, 4.0f, 0.0f, 4.5f};
  SamplingParams p;
  p.temperature = 5.0f;  // flat: without top-k every token shows up
  p.top_k = 2;
  SamplerRng rng(7);
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) seen.insert(SampleToken(logits, p, {}, 0, 0, rng).token_id);
  EXPECT_EQ(seen, (std::set<int32_t>{1, 4}));
}

TEST(SamplerTest, TopPKeepsSmallestNucleus) {
  // Probabilities 0.5, 0.3, 0.2 at temperature 1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  p.top_p = 0.75f;
  SamplerRng rng(3);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[SampleToken(logits, p, {}, 0, 0, rng).token_id];
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_NEAR(counts[0] / 2000.0, 0.5 / 0.8, 0.05);
}

// The nucleus is the smallest set whose probability reaches top_p: two
// equally likely tokens at top_p 0.5 keep only the first (the lower id).
TEST(SamplerTest, TopPStopsAtTheTokenThatReachesIt) {
  const std::vector<float> logits = {1.0f, 1.0f};
  SamplingParams p;
  p.top_p = 0.5f;
  SamplerRng rng(9);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(SampleToken(logits, p, {}, 0, 0, rng).token_id, 0) << i;
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p;
  p.min_p = 0.4f;  // threshold 0.24: keeps 0 and 1
  SamplerRng rng(5);
  std::set<int32_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(SampleToken(logits, p, {}, 0, 0, rng).token_id);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, TemperatureMatchesSoftmax) {
  const std::vector<float> logits = {0.0f, std::log(3.0f)};  // 1:3 at T=1
  SamplingParams p;
  p.temperature = 1.0f;
  SamplerRng rng(11);
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += SampleToken(logits, p, {}, 0, 0, rng).token_id;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(SamplerTest, LogprobsAreRawLogSoftmaxMostLikelyFirst) {
  const std::vector<float> logits = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  SamplerRng rng(1);
  SampleResult r = SampleToken(logits, Greedy(), {}, 0, 2, rng);
  EXPECT_EQ(r.token_id, 1);
  EXPECT_NEAR(r.logprob, std::log(0.5f), 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);
  EXPECT_NEAR(r.top_logprobs[1].second, std::log(0.3f), 1e-5);
}

// A likely token's logprob keeps its own precision, however large the
// logits: -log(1 + e^-12) = -6.1442e-6 beside a logit of 700, whose ulp
// (6.1e-5) the max-plus-log-sum order rounded it to (0 here).
TEST(SamplerTest, LikelyTokensLogprobsArePreciseBesideLargeLogits) {
  const std::vector<float> logits = {700.0f, 688.0f};
  SamplerRng rng(1);
  const SampleResult r = SampleToken(logits, Greedy(), {}, 0, 2, rng);
  ASSERT_EQ(r.token_id, 0);
  const double want = -std::log1p(std::exp(-12.0));
  EXPECT_NEAR(r.logprob, want, 1e-6 * -want);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_NEAR(r.top_logprobs[0].second, want, 1e-6 * -want);
  EXPECT_NEAR(r.top_logprobs[1].second, -12.0 + want, 1e-6 * 12);
}

// The log-softmax is skipped where no logprob is wanted; "logprobs": 0
// (sampled_logprob) still gets the sampled token's own, and no alternatives.
TEST(SamplerTest, SampledTokensLogprobOnlyWhenAsked) {
  const std::vector<float> probs = {0.2f, 0.5f, 0.3f};
  const std::vector<float> logits = {std::log(probs[0]), std::log(probs[1]), std::log(probs[2])};
  SamplingParams p = Greedy();
  SamplerRng rng(1);
  const SampleResult none = SampleToken(logits, p, {}, 0, 0, rng);
  EXPECT_EQ(none.token_id, 1);
  EXPECT_EQ(none.logprob, 0.0f);
  p.sampled_logprob = true;
  for (float temperature : {0.0f, 1.0f}) {
    p.temperature = temperature;
    const SampleResult own = SampleToken(logits, p, {}, 0, 0, rng);
    EXPECT_NEAR(own.logprob, std::log(probs[own.token_id]), 1e-5) << own.token_id;
    EXPECT_TRUE(own.top_logprobs.empty());
  }
}

// A penalty that overflows the penalised logits (1e-45 divides them into
// infinity) used to make every probability NaN, and the least likely token
// then came out every time.
TEST(SamplerTest, OverflowingPenaltyNeverYieldsNaNOrTheLeastLikelyToken) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.repetition_penalty = 1e-45f;
  const std::vector<float> logits = {5.0f, 4.0f, 3.0f, -10.0f};
  SamplerRng rng(11);
  std::set<int32_t> drawn;
  for (int i = 0; i < 200; ++i) {
    const SampleResult r = SampleToken(logits, p, {0, 1, 2}, 0, 2, rng);
    drawn.insert(r.token_id);
    EXPECT_FALSE(std::isnan(r.logprob));
  }
  EXPECT_EQ(drawn.count(3), 0u);
  EXPECT_GT(drawn.size(), 1u);  // the three penalised tokens tie at the top
}

TEST(SamplerTest, NonFiniteLogitsAreOrderedNotNaN) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> with_nan = {kNaN, 1.0f, 2.0f, kNaN, 0.5f};
  SamplerRng rng(3);
  EXPECT_EQ(SampleToken(with_nan, Greedy(), {}, 0, 0, rng).token_id, 2);
  SamplingParams p;
  p.temperature = 1.0f;
  for (int i = 0; i < 200; ++i) {
    const SampleResult r = SampleToken(with_nan, p, {}, 0, 5, rng);
    EXPECT_TRUE(r.token_id == 1 || r.token_id == 2 || r.token_id == 4) << r.token_id;
    EXPECT_FALSE(std::isnan(r.logprob));
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    EXPECT_EQ(r.top_logprobs[0].first, 2);  // NaN ids last
    EXPECT_EQ(r.top_logprobs[3].first, 0);
    EXPECT_EQ(r.top_logprobs[4].first, 3);
    for (const auto& [id, logprob] : r.top_logprobs) EXPECT_FALSE(std::isnan(logprob)) << id;
  }
  const std::vector<float> with_inf = {-kInf, kInf, 0.0f};
  p.sampled_logprob = true;
  for (int i = 0; i < 50; ++i) {
    const SampleResult r = SampleToken(with_inf, p, {}, 0, 0, rng);
    EXPECT_EQ(r.token_id, 1);
    EXPECT_FALSE(std::isnan(r.logprob));
  }
}

}  // namespace
}  // namespace switchserve
