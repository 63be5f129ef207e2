// Device sampling (kernels/cuda/sampling.h) against the host sampler
// (engine/runtime/sampler.h): the same token, logprob and alternatives from
// the same logits, parameters, history and uniform draw, for greedy and
// temperature sampling with every filter, both candidate paths (selection
// and full sort), tied logits and a repeated history, the presence and
// frequency penalties, a logit bias, min_tokens, bad_words and
// allowed_token_ids.
#include "kernels/cuda/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/runtime/sampler.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using cuda::DeviceSampleParams;

constexpr int kMaxLogprobs = 5;

struct Request {
  SamplingParams params;
  std::vector<int32_t> history;
  int64_t prompt_length = 0;  // history's first ids are the prompt's
  uint64_t seed = 0;
};

struct Sampled {
  std::vector<int32_t> token;
  std::vector<float> logprob;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// Samples row i of `logits` for request i, all in one launch; the uniform of
// each non-greedy request is the first draw of its generator.
Sampled SampleOnDevice(const std::vector<float>& logits, int vocab,
                       const std::vector<Request>& requests) {
  const int n = static_cast<int>(requests.size());
  std::vector<DeviceSampleParams> params(n);
  std::vector<int32_t> history;
  for (int i = 0; i < n; ++i) {
    const SamplingParams& s = requests[i].params;
    DeviceSampleParams& p = params[i];
    SamplerRng rng(requests[i].seed);
    p.uniform = s.temperature == 0.0f ? 0.0 : rng.Uniform();
    p.temperature = s.temperature;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.repetition_penalty = s.repetition_penalty;
    p.presence_penalty = s.presence_penalty;
    p.frequency_penalty = s.frequency_penalty;
    p.logits_row = i;
    p.top_k = s.top_k;
    p.n_logprobs = s.logprobs;
    p.history_begin = static_cast<int32_t>(history.size());
    history.insert(history.end(), requests[i].history.begin(), requests[i].history.end());
    p.history_end = static_cast<int32_t>(history.size());
    p.generated_begin = p.history_begin + static_cast<int32_t>(requests[i].prompt_length);
    p.bias_begin = p.history_end;
    const auto generated = absl::MakeConstSpan(requests[i].history)
                               .subspan(static_cast<size_t>(requests[i].prompt_length));
    for (const auto& [id, bias] : SampleBiases(s, generated)) {
      history.push_back(id);
      history.push_back(std::bit_cast<int32_t>(bias));
    }
    p.bias_end = static_cast<int32_t>(history.size());
    p.allowed_begin = p.bias_end;
    history.insert(history.end(), s.allowed_token_ids.begin(), s.allowed_token_ids.end());
    p.allowed_end = static_cast<int32_t>(history.size());
  }
  if (history.empty()) history.push_back(0);
  const auto [token, logprob, top_ids, top_logprobs] = InEveryOrder([&] {
    DeviceArray<float> d_logits(logits), d_logprob(n), d_top_logprobs(n * kMaxLogprobs);
    DeviceArray<DeviceSampleParams> d_params(params);
    DeviceArray<int32_t> d_history(history), d_token(n), d_top_ids(n * kMaxLogprobs);
    DeviceArray<char> scratch(n * cuda::SamplingScratchBytes(vocab));
    cuda::SamplingArgs a;
    a.logits = d_logits.get();
    a.logits_ld = vocab;
    a.vocab = vocab;
    a.params = d_params.get();
    a.samples = n;
    a.history = d_history.get();
    a.scratch = scratch.get();
    a.max_logprobs = kMaxLogprobs;
    a.token = d_token.get();
    a.logprob = d_logprob.get();
    a.top_ids = d_top_ids.get();
    a.top_logprobs = d_top_logprobs.get();
    EXPECT_EQ(cuda::LaunchSampling(a, nullptr), cudaSuccess);
    return std::make_tuple(d_token.Download(), d_logprob.Download(), d_top_ids.Download(),
                           d_top_logprobs.Download());
  });
  return Sampled{token, logprob, top_ids, top_logprobs};
}

std::vector<float> Logits(int rows, int vocab, bool tied, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::vector<float> z(static_cast<size_t>(rows) * vocab);
  for (float& v : z) v = tied ? static_cast<float>(level(rng)) : normal(rng);
  return z;
}

// Returns the device's choices after comparing them with the host's.
Sampled ExpectHostSamplerChoices(const std::vector<float>& logits, int vocab,
                                 const std::vector<Request>& requests) {
  const Sampled got = SampleOnDevice(logits, vocab, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    SCOPED_TRACE("request " + std::to_string(i) + " T=" + std::to_string(r.params.temperature) +
                 " top_k=" + std::to_string(r.params.top_k) + " top_p=" +
                 std::to_string(r.params.top_p) + " min_p=" + std::to_string(r.params.min_p) +
                 " penalty=" + std::to_string(r.params.repetition_penalty) +
                 " presence=" + std::to_string(r.params.presence_penalty) +
                 " frequency=" + std::to_string(r.params.frequency_penalty) +
                 " biases=" + std::to_string(r.params.logit_bias.size()) +
                 " min_tokens=" + std::to_string(r.params.min_tokens) +
                 " bad_words=" + std::to_string(r.params.bad_words_ids.size()) +
                 " allowed=" + std::to_string(r.params.allowed_token_ids.size()));
    SamplerRng rng(r.seed);
    // The kernel computes every sample's logprob, also where none was asked.
    SamplingParams params = r.params;
    params.sampled_logprob = true;
    const SampleResult want =
        SampleToken(absl::MakeConstSpan(logits.data() + i * vocab, vocab), params, r.history,
                    r.prompt_length, r.params.logprobs, rng);
    EXPECT_EQ(got.token[i], want.token_id);
    EXPECT_NEAR(got.logprob[i], want.logprob, 1e-6 * (1 + std::fabs(want.logprob)));
    EXPECT_EQ(want.top_logprobs.size(), static_cast<size_t>(r.params.logprobs));
    for (int j = 0; j < r.params.logprobs; ++j) {
      EXPECT_EQ(got.top_ids[i * kMaxLogprobs + j], want.top_logprobs[j].first) << "rank " << j;
      EXPECT_NEAR(got.top_logprobs[i * kMaxLogprobs + j], want.top_logprobs[j].second, 1e-5)
          << "rank " << j;
    }
  }
  return got;
}

std::vector<Request> Requests(int count, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Request> requests(count);
  for (int i = 0; i < count; ++i) {
    Request& r = requests[i];
    SamplingParams& p = r.params;
    p.temperature = i % 5 == 0 ? 0.0f : 0.3f + static_cast<float>(rng() % 150) / 100.0f;
    const int k_choice = static_cast<int>(rng() % 4);
    p.top_k = k_choice == 0   ? 0
              : k_choice == 1 ? 1 + static_cast<int>(rng() % 20)
              : k_choice == 2 ? 65 + static_cast<int>(rng() % 30)
                              : vocab + 3;
    p.top_p = rng() % 2 == 0 ? 1.0f : 0.5f + static_cast<float>(rng() % 50) / 100.0f;
    p.min_p = rng() % 3 == 0 ? static_cast<float>(rng() % 20) / 100.0f : 0.0f;
    p.repetition_penalty = rng() % 2 == 0 ? 1.0f : 1.1f + static_cast<float>(rng() % 40) / 10.0f;
    p.logprobs = static_cast<int>(rng() % (kMaxLogprobs + 1));
    const int history = static_cast<int>(rng() % 40);
    for (int h = 0; h < history; ++h) r.history.push_back(static_cast<int32_t>(rng() % vocab));
    if (!r.history.empty()) r.history.push_back(r.history.front());  // a repeated id
    r.seed = rng();
    // Presence and frequency penalties over the history's generated part,
    // a logit bias on a few ids.
    if (rng() % 2 == 0) {
      p.presence_penalty = static_cast<float>(static_cast<int>(rng() % 41) - 20) / 10.0f;
      p.frequency_penalty = static_cast<float>(static_cast<int>(rng() % 41) - 20) / 10.0f;
      r.prompt_length = static_cast<int64_t>(rng() % (r.history.size() + 1));
    }
    const int biases = static_cast<int>(rng() % 4);
    for (int b = 0; b < biases; ++b) {
      const auto id = static_cast<int32_t>(rng() % vocab);
      if (std::any_of(p.logit_bias.begin(), p.logit_bias.end(),
                      [&](const auto& entry) { return entry.first == id; })) {
        continue;
      }
      p.logit_bias.emplace_back(id, static_cast<float>(static_cast<int>(rng() % 201) - 100) / 7.0f);
    }
    std::sort(p.logit_bias.begin(), p.logit_bias.end());
    // min_tokens holding back a few ids (a biased one among them), or not
    // yet / no longer.
    if (rng() % 3 == 0) {
      p.min_tokens = static_cast<int>(rng() % 30);
      std::set<int32_t> ids = {static_cast<int32_t>(rng() % vocab),
                               static_cast<int32_t>(rng() % vocab)};
      if (!p.logit_bias.empty()) ids.insert(p.logit_bias.front().first);
      p.min_tokens_ids.assign(ids.begin(), ids.end());
    }
    // bad_words: a one-id word, and one the generated tokens' last id begins
    // (banning its second id now), or a longer one that does not match.
    if (rng() % 3 == 0) {
      p.bad_words_ids.push_back({static_cast<int32_t>(rng() % vocab)});
      const auto generated = static_cast<int64_t>(r.history.size()) - r.prompt_length;
      if (generated > 0) {
        p.bad_words_ids.push_back({r.history.back(), static_cast<int32_t>(rng() % vocab)});
      }
      p.bad_words_ids.push_back({static_cast<int32_t>(rng() % vocab),
                                 static_cast<int32_t>(rng() % vocab),
                                 static_cast<int32_t>(rng() % vocab)});
    }
    // allowed_token_ids: a third of the vocabulary or a handful, which the
    // bans above may empty.
    if (rng() % 4 == 0) {
      std::set<int32_t> ids;
      const int size = rng() % 2 == 0 ? std::max(1, vocab / 3) : 1 + static_cast<int>(rng() % 4);
      for (int a = 0; a < size; ++a) ids.insert(static_cast<int32_t>(rng() % vocab));
      p.allowed_token_ids.assign(ids.begin(), ids.end());
    }
  }
  return requests;
}

TEST(SimtSampling, PicksWhatTheHostSamplerPicks) {
  SIMT_REQUIRE_DEVICE();
  for (const int vocab : {5, 64, 300, 1000}) {
    for (const bool tied : {false, true}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + (tied ? " tied" : ""));
      const int n = 24;
      ExpectHostSamplerChoices(Logits(n, vocab, tied, vocab + (tied ? 1 : 0)), vocab,
                               Requests(n, vocab, 7 * vocab + tied));
    }
  }
}

// Many draws of one distribution: each seed's token is the host's.
TEST(SimtSampling, EverySeedDrawsTheHostsToken) {
  SIMT_REQUIRE_DEVICE();
  const int vocab = 50, n = 32;
  const std::vector<float> row = Logits(1, vocab, false, 3);
  std::vector<float> logits;
  std::vector<Request> requests(n);
  for (int i = 0; i < n; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    requests[i].params.temperature = 1.0f;
    requests[i].params.top_p = i % 2 == 0 ? 1.0f : 0.9f;
    requests[i].seed = 1000 + i;
  }
  const Sampled got = ExpectHostSamplerChoices(logits, vocab, requests);
  // Not all the same token: the draws matter.
  int distinct = 0;
  std::vector<bool> seen(vocab, false);
  for (int32_t t : got.token) distinct += seen[t] ? 0 : (seen[t] = true, 1);
  EXPECT_GT(distinct, 3);
}

// A vocabulary of thousands, every candidate kept or a top_k past the
// selection's 64: the kernel sorts only the prefix of the order the cuts and
// the draw read (a few candidates at a low temperature, most of the
// vocabulary at a high one), and every draw is the host's, with top_p,
// min_p (whose candidates the prefix must all hold) and both together.
TEST(SimtSampling, LargeVocabularyDrawsAreTheHosts) {
  SIMT_REQUIRE_DEVICE();
  const int vocab = 4096;
  std::vector<Request> requests;
  for (const float temperature : {0.05f, 0.7f, 1.0f, 4.0f}) {
    for (const int top_k : {0, 100, 3000}) {
      for (const float top_p : {1.0f, 0.8f}) {
        for (const float min_p : {0.0f, 0.02f, 0.3f}) {
          Request& r = requests.emplace_back();
          r.params.temperature = temperature;
          r.params.top_k = top_k;
          r.params.top_p = top_p;
          r.params.min_p = min_p;
          r.seed = 100 + requests.size();
        }
      }
    }
  }
  const int n = static_cast<int>(requests.size());
  std::vector<float> logits = Logits(n, vocab, false, 11);
  for (float& z : logits) z *= 1.5f;  // peaked enough for short prefixes
  const Sampled got = ExpectHostSamplerChoices(logits, vocab, requests);
  std::set<int32_t> distinct(got.token.begin(), got.token.end());
  EXPECT_GT(distinct.size(), 20u);
}

// The penalty moves greedy off a token in the history, once per distinct id.
TEST(SimtSampling, RepetitionPenaltyAppliesOncePerId) {
  SIMT_REQUIRE_DEVICE();
  const int vocab = 8;
  std::vector<float> logits = {1.0f, 4.0f, 3.9f, -1.0f, 0.0f, 2.0f, 3.0f, 0.5f};
  Request r;
  r.params.temperature = 0.0f;
  r.params.repetition_penalty = 1.02f;  // 4.0 / 1.02 = 3.92 > 3.9; twice would be 3.84
  r.history = {1, 1, 1, 3};
  r.params.logprobs = 2;
  const Sampled got = ExpectHostSamplerChoices(logits, vocab, {r});
  EXPECT_EQ(got.token[0], 1);
}

// Presence and frequency penalties count the generated ids only (after
// prompt_length), each distinct id penalised once by frequency * count +
// presence; a logit bias comes before them.
TEST(SimtSampling, PresenceAndFrequencyPenaltiesCountGeneratedIdsOnly) {
  SIMT_REQUIRE_DEVICE();
  const int vocab = 8;
  const std::vector<float> row = {1.0f, 4.0f, 3.9f, 3.0f, 0.0f, 2.0f, 3.5f, 0.5f};
  std::vector<float> logits;
  std::vector<Request> requests;
  auto add = [&](float presence, float frequency, std::vector<int32_t> history,
                 int64_t prompt_length, std::vector<std::pair<int32_t, float>> bias = {}) {
    logits.insert(logits.end(), row.begin(), row.end());
    Request r;
    r.params.temperature = 0.0f;
    r.params.presence_penalty = presence;
    r.params.frequency_penalty = frequency;
    r.params.logit_bias = std::move(bias);
    r.params.logprobs = 2;
    r.history = std::move(history);
    r.prompt_length = prompt_length;
    requests.push_back(r);
  };
  add(0.2f, 0.0f, {1, 1, 1}, 0);         // 4.0 - 0.2 = 3.8 < 3.9: token 2
  add(0.0f, 0.05f, {1, 1}, 0);           // 4.0 - 0.1 = 3.9, tie to the lower id: 1
  add(0.0f, 0.05f, {1, 1, 1}, 0);        // 4.0 - 0.15 = 3.85 < 3.9: 2
  add(0.2f, 0.0f, {1, 1, 1}, 3);         // all prompt: no penalty, 1
  add(0.0f, 0.05f, {1, 1, 1, 1}, 2);     // two generated: 3.9, 1
  add(-1.0f, 0.0f, {6}, 0);              // a negative presence favours 6: 4.5
  add(0.0f, 0.0f, {}, 0, {{3, 1.5f}});   // the bias lifts 3 to 4.5
  add(0.5f, 0.0f, {3}, 0, {{3, 1.5f}});  // biased, then penalised: 4.0, tie: 1
  const Sampled got = ExpectHostSamplerChoices(logits, vocab, requests);
  EXPECT_EQ(got.token, (std::vector<int32_t>{2, 1, 2, 1, 1, 6, 3, 1}));
}

// `count` requests, each made by make_request(i), sampling one row of 8
// logits (1 the most likely, then 2, 6, 3, 5): the device's choices, after
// comparing them with the host's.
Sampled SampleOneRow(int count, const std::function<Request(int)>& make_request) {
  const int vocab = 8;
  const std::vector<float> row = {1.0f, 4.0f, 3.9f, 3.0f, 0.0f, 2.0f, 3.5f, 0.5f};
  std::vector<float> logits;
  std::vector<Request> requests;
  for (int i = 0; i < count; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    requests.push_back(make_request(i));
  }
  return ExpectHostSamplerChoices(logits, vocab, requests);
}

// min_tokens: while fewer tokens are generated, its ids get a bias of -inf
// (in place of their own bias); greedy and every draw pick another token.
// Once enough are generated, the ids are back.
TEST(SimtSampling, MinTokensHoldsItsIdsBackUntilEnoughAreGenerated) {
  SIMT_REQUIRE_DEVICE();
  const Sampled got = SampleOneRow(24, [](int i) {
    Request r;
    r.params.temperature = i % 3 == 0 ? 0.0f : 2.0f;
    r.params.min_tokens = 3;
    r.params.min_tokens_ids = {1, 2};
    if (i % 2 == 1) r.params.logit_bias = {{1, 50.0f}};
    r.prompt_length = 1;
    r.history.assign(1 + (i < 20 ? i % 3 : 3), 0);  // 0-2 tokens generated; 3 for the last four
    r.seed = 500 + i;
    return r;
  });
  for (int i = 0; i < 20; ++i) {
    EXPECT_NE(got.token[i], 1) << i;
    EXPECT_NE(got.token[i], 2) << i;
  }
  EXPECT_EQ(got.token[21], 1);  // biased by 50, no longer held back
}

// allowed_token_ids: greedy and every draw pick among them, whatever the
// others' logits and biases and at any temperature; a bad word's last id is
// banned after its prefix was generated (and within the allowed ids too).
TEST(SimtSampling, AllowedIdsAndBadWordsKeepTheirTokensOut) {
  SIMT_REQUIRE_DEVICE();
  const Sampled got = SampleOneRow(24, [](int i) {
    Request r;
    // The largest temperature too, where exp((s - best) / t) alone would
    // weigh the excluded ids near the others.
    r.params.temperature =
        i % 3 == 0 ? 0.0f : (i % 3 == 1 ? 2.0f : std::numeric_limits<float>::max());
    r.params.allowed_token_ids = {0, 3, 5, 7};
    r.params.logit_bias = {{1, 50.0f}, {7, 0.25f}};
    if (i % 2 == 1) r.params.bad_words_ids = {{4, 3}, {2}};  // the generated 4 bans 3
    // A penalty below 1 multiplies the excluded 6 and 4: they stay out.
    if (i % 4 < 2) r.params.repetition_penalty = 0.01f;
    r.prompt_length = 1;
    r.history = {6, 4};
    r.seed = 900 + i;
    return r;
  });
  for (int i = 0; i < 24; ++i) {
    const std::set<int32_t> allowed =
        i % 2 == 1 ? std::set<int32_t>{0, 5, 7} : std::set<int32_t>{0, 3, 5, 7};
    EXPECT_TRUE(allowed.count(got.token[i])) << i << ": " << got.token[i];
  }
  EXPECT_EQ(got.token[0], 3);  // greedy among the allowed
  EXPECT_EQ(got.token[3], 5);  // 3 banned
}

// Non-finite logits (a model that overflows) and a penalty that overflows a
// logit: ranked as the host ranks them, NaN least likely and +-inf the
// largest finite magnitudes. The kernel used them raw: NaN won greedy in
// lane 0, made every probability NaN (each draw took the least likely
// candidate) and every logprob NaN.
TEST(SimtSampling, NonFiniteLogitsAreRankedAsTheHostRanksThem) {
  SIMT_REQUIRE_DEVICE();
  const int vocab = 8;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      {nan, 1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f},
      {1.0f, nan, 2.0f, 0.5f, nan, 3.0f, 2.5f, 0.0f},
      {1.0f, 2.0f, inf, 0.0f, 1.5f, 1.0f, 1.0f, 1.0f},
      {3.4e37f, 1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.5f, 0.0f},
  };
  std::vector<float> logits;
  std::vector<Request> requests;
  for (size_t row = 0; row < rows.size(); ++row) {
    for (int seed = 0; seed < 6; ++seed) {
      logits.insert(logits.end(), rows[row].begin(), rows[row].end());
      Request r;
      r.params.temperature = seed == 0 ? 0.0f : 1.0f;
      r.params.top_k = seed == 2 ? 3 : 0;
      r.params.top_p = seed == 3 ? 0.9f : 1.0f;
      r.params.logprobs = 3;
      if (row == 3) {
        r.params.repetition_penalty = 0.01f;  // 3.4e37 / 0.01 overflows to inf
        r.history = {0};
      }
      r.seed = 100 + seed;
      requests.push_back(r);
    }
  }
  const Sampled got = ExpectHostSamplerChoices(logits, vocab, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got.logprob[i])) << "request " << i;
    const size_t row = i / 6;
    if (row == 0 && requests[i].params.temperature == 0.0f) {
      EXPECT_EQ(got.token[i], 5);
    } else if (row == 1) {
      EXPECT_NE(got.token[i], 1) << "request " << i;
    } else if (row == 2) {
      EXPECT_EQ(got.token[i], 2) << "request " << i;
    } else if (row == 3) {
      EXPECT_EQ(got.token[i], 0) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace switchserve::simt_test
