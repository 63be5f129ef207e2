#include "server/request_validation.h"

#include <functional>
#include <limits>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"

namespace switchserve {
namespace {

class RequestValidationTest : public ::testing::Test {
 protected:
  absl::StatusOr<GenerationRequest> Validate(
      const std::function<void(v1::GenerateRequest*)>& mutate) {
    v1::GenerateRequest request;
    request.set_text("hello");
    mutate(&request);
    return ValidateGenerateRequest(request, *tokenizer_, limits_);
  }
  // Expects INVALID_ARGUMENT whose message starts with `field`.
  void ExpectInvalid(const std::function<void(v1::GenerateRequest*)>& mutate,
                     const std::string& field) {
    auto result = Validate(mutate);
    ASSERT_FALSE(result.ok()) << field;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(result.status().message(), absl::StrCat(field, ":")))
        << result.status().message();
  }

  std::unique_ptr<Tokenizer> tokenizer_ = CreateByteTokenizer();
  RequestLimits limits_{.vocab_size = 256, .context_length = 64};
};

TEST_F(RequestValidationTest, DefaultsAndValues) {
  auto request = Validate([](auto* r) {
    r->mutable_sampling()->set_temperature(0.5f);
    r->mutable_sampling()->set_seed(7);
    r->mutable_sampling()->add_stop(std::string("\n"));
    r->set_logprobs(3);
  });
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->prompt, (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'}));
  EXPECT_EQ(request->sampling.max_new_tokens, 64 - 5);  // default capped by the context
  EXPECT_EQ(request->sampling.temperature, 0.5f);
  EXPECT_EQ(request->sampling.top_p, 1.0f);
  EXPECT_EQ(request->sampling.seed, 7u);
  EXPECT_EQ(request->sampling.logprobs, 3);

  auto unset = Validate([](auto*) {});
  ASSERT_TRUE(unset.ok());
  EXPECT_EQ(unset->sampling.temperature, 1.0f);
  EXPECT_EQ(unset->sampling.repetition_penalty, 1.0f);
}

// `priority` only where the server schedules by priority; any int32 there.
TEST_F(RequestValidationTest, PriorityNeedsThePrioritySchedulingPolicy) {
  auto zero = Validate([](auto* r) { r->set_priority(0); });
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->priority, 0);
  ExpectInvalid([](auto* r) { r->set_priority(-3); }, "priority");
  limits_.priority_scheduling = true;
  for (int32_t priority : {-3, 0, 7, std::numeric_limits<int32_t>::min()}) {
    auto request = Validate([&](auto* r) { r->set_priority(priority); });
    ASSERT_TRUE(request.ok()) << request.status();
    EXPECT_EQ(request->priority, priority);
  }
}

// A request without a seed gets a random one: the same prompt sent twice
// samples two different continuations (as the HTTP API's answer to n > 1
// expects), however many are sent.
TEST_F(RequestValidationTest, RequestsWithoutASeedGetDifferentSeeds) {
  std::set<uint64_t> seeds;
  for (int i = 0; i < 8; ++i) {
    auto request = Validate([](auto*) {});
    ASSERT_TRUE(request.ok());
    seeds.insert(request->sampling.seed);
  }
  EXPECT_EQ(seeds.size(), 8u);
}

TEST_F(RequestValidationTest, PenaltiesAndLogitBias) {
  auto request = Validate([](auto* r) {
    v1::SamplingParams* s = r->mutable_sampling();
    s->set_presence_penalty(-2.0f);
    s->set_frequency_penalty(1.5f);
    (*s->mutable_logit_bias())[200] = -100.0f;
    (*s->mutable_logit_bias())[7] = 100.0f;
    (*s->mutable_logit_bias())[65] = 0.25f;
  });
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->sampling.presence_penalty, -2.0f);
  EXPECT_EQ(request->sampling.frequency_penalty, 1.5f);
  // Ascending ids, whatever the map's order.
  EXPECT_EQ(request->sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{7, 100.0f}, {65, 0.25f}, {200, -100.0f}}));
  auto unset = Validate([](auto*) {});
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->sampling.PenalisesHistory());
  EXPECT_TRUE(unset->sampling.logit_bias.empty());

  for (float penalty : {-2.01f, 2.0001f, std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    ExpectInvalid([&](auto* r) { r->mutable_sampling()->set_presence_penalty(penalty); },
                  "sampling.presence_penalty");
    ExpectInvalid([&](auto* r) { r->mutable_sampling()->set_frequency_penalty(penalty); },
                  "sampling.frequency_penalty");
  }
  auto over = Validate([](auto* r) { r->mutable_sampling()->set_frequency_penalty(2.5f); });
  EXPECT_EQ(over.status().message(), "sampling.frequency_penalty: must be in [-2, 2], found 2.5");
  auto bias = Validate([](auto* r) { (*r->mutable_sampling()->mutable_logit_bias())[3] = 101; });
  EXPECT_EQ(bias.status().message(), "sampling.logit_bias[3]: must be in [-100, 100], found 101");
  ExpectInvalid([](auto* r) { (*r->mutable_sampling()->mutable_logit_bias())[3] = NAN; },
                "sampling.logit_bias[3]");
  auto outside = Validate([](auto* r) { (*r->mutable_sampling()->mutable_logit_bias())[256] = 1; });
  EXPECT_EQ(outside.status().message(),
            "sampling.logit_bias: id 256 is outside the vocabulary [0, 256)");
  ExpectInvalid([](auto* r) { (*r->mutable_sampling()->mutable_logit_bias())[-1] = 1; },
                "sampling.logit_bias");
  limits_.max_logit_bias = 2;
  auto many = Validate([](auto* r) {
    for (int id : {1, 2, 3}) (*r->mutable_sampling()->mutable_logit_bias())[id] = 1;
  });
  EXPECT_EQ(many.status().message(), "sampling.logit_bias: at most 2 ids, found 3");
}

// truncate_prompt_tokens keeps the prompt's last tokens, before the context
// check; a shorter prompt is kept whole; -1 keeps as many as fit; 0 and
// below -1 are refused. min_tokens is in [0, max_new_tokens].
TEST_F(RequestValidationTest, TruncatedPromptsAndMinTokens) {
  auto kept = Validate([](auto* r) { r->set_truncate_prompt_tokens(3); });
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->prompt, (std::vector<int32_t>{'l', 'l', 'o'}));
  auto whole = Validate([](auto* r) { r->set_truncate_prompt_tokens(50); });
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->prompt.size(), 5u);
  auto fits = Validate([](auto* r) {
    r->set_text(std::string(100, 'a') + "z");
    r->set_truncate_prompt_tokens(10);
    r->mutable_sampling()->set_max_new_tokens(54);
  });
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->prompt.back(), 'z');
  EXPECT_EQ(fits->prompt.size(), 10u);
  ExpectInvalid([](auto* r) { r->set_truncate_prompt_tokens(0); }, "truncate_prompt_tokens");
  ExpectInvalid([](auto* r) { r->set_truncate_prompt_tokens(-2); }, "truncate_prompt_tokens");
  // -1: as many of the last tokens as fit beside max_new_tokens (context 64).
  auto fitted = Validate([](auto* r) {
    r->set_text(std::string(100, 'a') + "z");
    r->set_truncate_prompt_tokens(-1);
    r->mutable_sampling()->set_max_new_tokens(24);
  });
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(fitted->prompt.size(), 40u);
  EXPECT_EQ(fitted->prompt.back(), 'z');
  EXPECT_EQ(fitted->sampling.max_new_tokens, 24);
  // Unset max_new_tokens: its default (256 here), up to half the context.
  auto halved = Validate([](auto* r) {
    r->set_text(std::string(100, 'a'));
    r->set_truncate_prompt_tokens(-1);
  });
  ASSERT_TRUE(halved.ok()) << halved.status();
  EXPECT_EQ(halved->prompt.size(), 32u);
  EXPECT_EQ(halved->sampling.max_new_tokens, 32);
  auto short_whole = Validate([](auto* r) { r->set_truncate_prompt_tokens(-1); });
  ASSERT_TRUE(short_whole.ok());
  EXPECT_EQ(short_whole->prompt.size(), 5u);
  // max_new_tokens past the context is refused as without truncation.
  ExpectInvalid(
      [](auto* r) {
        r->set_truncate_prompt_tokens(-1);
        r->mutable_sampling()->set_max_new_tokens(64);
      },
      "sampling.max_new_tokens");
  ExpectInvalid(
      [](auto* r) {
        r->set_text(std::string(100, 'a'));
        r->set_truncate_prompt_tokens(64);
      },
      "text");

  auto min_tokens = Validate([](auto* r) {
    r->mutable_sampling()->set_max_new_tokens(8);
    r->mutable_sampling()->set_min_tokens(8);
  });
  ASSERT_TRUE(min_tokens.ok());
  EXPECT_EQ(min_tokens->sampling.min_tokens, 8);
  ExpectInvalid(
      [](auto* r) {
        r->mutable_sampling()->set_max_new_tokens(8);
        r->mutable_sampling()->set_min_tokens(9);
      },
      "sampling.min_tokens");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_min_tokens(-1); }, "sampling.min_tokens");
}

// A tokenizer with word-start tokens, as BPE vocabularies have them: a space
// and the letter after it are one token (the letter's byte + 128); every
// other byte is its own.
class WordStartTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == ' ' && i + 1 < text.size() && absl::ascii_isalpha(text[i + 1])) {
        ids.push_back(static_cast<unsigned char>(text[++i]) + 128);
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]));
      }
    }
    return ids;
  }
  absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view text,
                                                   std::vector<size_t>*) const override {
    return Encode(text);
  }
  std::string Decode(absl::Span<const int32_t>) const override { return ""; }
  std::string_view PieceBytes(int32_t, bool) const override { return ""; }
  std::string_view kind() const override { return "word-start"; }
  int vocab_size() const override { return 256; }
};

// bad_words: each word tokenized without its leading whitespace, and after a
// space too where that gives as many tokens with another first one (vLLM's
// rule); allowed_token_ids sorted, repeats dropped.
TEST_F(RequestValidationTest, BadWordsAndAllowedTokenIds) {
  using Ids = std::vector<std::vector<int32_t>>;
  auto words = Validate([](auto* r) {
    r->mutable_sampling()->add_bad_words(std::string("God"));
    r->mutable_sampling()->add_bad_words(std::string(" \tx "));
  });
  ASSERT_TRUE(words.ok()) << words.status();
  EXPECT_EQ(words->sampling.bad_words_ids, (Ids{{'G', 'o', 'd'}, {'x', ' '}}));
  tokenizer_ = std::make_unique<WordStartTokenizer>();
  auto word_start = Validate([](auto* r) {
    r->mutable_sampling()->add_bad_words(std::string(" God"));
    r->mutable_sampling()->add_bad_words(std::string("1 b"));  // " 1 b": one token more
  });
  ASSERT_TRUE(word_start.ok()) << word_start.status();
  EXPECT_EQ(word_start->sampling.bad_words_ids,
            (Ids{{'G', 'o', 'd'}, {'G' + 128, 'o', 'd'}, {'1', 'b' + 128}}));
  tokenizer_ = CreateByteTokenizer();
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_bad_words(std::string("")); },
                "sampling.bad_words");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_bad_words(std::string(" \n ")); },
                "sampling.bad_words");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_bad_words(std::string("\xff")); },
                "sampling.bad_words");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_bad_words(std::string(257, 'a')); },
                "sampling.bad_words");
  ExpectInvalid(
      [](auto* r) {
        for (int i = 0; i < 65; ++i) r->mutable_sampling()->add_bad_words(std::string("a"));
      },
      "sampling.bad_words");
  auto most = Validate([](auto* r) {
    for (int i = 0; i < 64; ++i) r->mutable_sampling()->add_bad_words(std::string(256, 'a'));
  });
  EXPECT_TRUE(most.ok()) << most.status();

  auto allowed = Validate([](auto* r) {
    for (const int32_t id : {9, 3, 9, 255, 0}) r->mutable_sampling()->add_allowed_token_ids(id);
  });
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->sampling.allowed_token_ids, (std::vector<int32_t>{0, 3, 9, 255}));
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_allowed_token_ids(256); },
                "sampling.allowed_token_ids");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_allowed_token_ids(-1); },
                "sampling.allowed_token_ids");
}

// cache_salt: 1 to max_cache_salt_bytes bytes, carried to the engine; unset,
// the unsalted cache.
TEST_F(RequestValidationTest, CacheSalt) {
  auto unsalted = Validate([](auto*) {});
  ASSERT_TRUE(unsalted.ok());
  EXPECT_EQ(unsalted->cache_salt, "");
  auto salted = Validate([](auto* r) { r->set_cache_salt("tenant-a"); });
  ASSERT_TRUE(salted.ok()) << salted.status();
  EXPECT_EQ(salted->cache_salt, "tenant-a");
  EXPECT_TRUE(Validate([&](auto* r) {
                r->set_cache_salt(std::string(limits_.max_cache_salt_bytes, 's'));
              }).ok());
  ExpectInvalid([](auto* r) { r->set_cache_salt(""); }, "cache_salt");
  ExpectInvalid(
      [&](auto* r) { r->set_cache_salt(std::string(limits_.max_cache_salt_bytes + 1, 's')); },
      "cache_salt");
}

TEST_F(RequestValidationTest, PromptLimits) {
  ExpectInvalid([](auto* r) { r->set_text(""); }, "text");
  ExpectInvalid([](auto* r) { r->clear_prompt(); }, "prompt");
  ExpectInvalid([](auto* r) { r->set_text(std::string(64, 'a')); }, "text");
  ExpectInvalid([](auto* r) { r->set_text("\xff"); }, "text");
  ExpectInvalid([](auto* r) { r->mutable_token_ids()->add_ids(256); }, "token_ids");
  ExpectInvalid([](auto* r) { r->mutable_token_ids(); }, "token_ids");
  auto too_long = Validate([](auto* r) { r->set_text(std::string(80, 'a')); });
  EXPECT_NE(too_long.status().message().find("context length is 64"), std::string::npos);
  auto ids = Validate([](auto* r) { r->mutable_token_ids()->add_ids(255); });
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->prompt, std::vector<int32_t>{255});
}

TEST_F(RequestValidationTest, SamplingRanges) {
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_max_new_tokens(0); },
                "sampling.max_new_tokens");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_max_new_tokens(60); },
                "sampling.max_new_tokens");  // 5 + 60 > 64
  EXPECT_TRUE(Validate([](auto* r) { r->mutable_sampling()->set_max_new_tokens(59); }).ok());
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_temperature(-1); },
                "sampling.temperature");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_temperature(NAN); },
                "sampling.temperature");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_top_k(-1); }, "sampling.top_k");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_top_p(0); }, "sampling.top_p");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_top_p(1.0001f); }, "sampling.top_p");
  EXPECT_TRUE(Validate([](auto* r) { r->mutable_sampling()->set_top_p(1); }).ok());
  // The value shown is the one sent, to the last digit that matters.
  auto just_over = Validate([](auto* r) { r->mutable_sampling()->set_top_p(1.0000001f); });
  EXPECT_EQ(just_over.status().message(), "sampling.top_p: must be in (0, 1], found 1.0000001");
  auto tiny = Validate([](auto* r) { r->mutable_sampling()->set_repetition_penalty(1e-45f); });
  EXPECT_EQ(tiny.status().message(),
            "sampling.repetition_penalty: must be in [0.01, 100], found 1e-45");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_min_p(-0.1f); }, "sampling.min_p");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->set_repetition_penalty(0); },
                "sampling.repetition_penalty");
  // Penalties that overflow a penalised logit (1e-45 used to pass and put NaN
  // into sampling), and non-numbers.
  for (float penalty : {1e-45f, 0.0099f, 100.5f, 1e30f, std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    ExpectInvalid([&](auto* r) { r->mutable_sampling()->set_repetition_penalty(penalty); },
                  "sampling.repetition_penalty");
  }
  for (float penalty : {0.01f, 100.0f}) {
    auto ok = Validate([&](auto* r) { r->mutable_sampling()->set_repetition_penalty(penalty); });
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->sampling.repetition_penalty, penalty);
  }
  ExpectInvalid(
      [](auto* r) {
        for (int i = 0; i < 17; ++i) r->mutable_sampling()->add_stop(std::string("x"));
      },
      "sampling.stop");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_stop(std::string(257, 'a')); },
                "sampling.stop");
  ExpectInvalid([](auto* r) { r->mutable_sampling()->add_stop_token_ids(-1); },
                "sampling.stop_token_ids");
  ExpectInvalid([](auto* r) { r->set_logprobs(-1); }, "logprobs");
  ExpectInvalid([](auto* r) { r->set_logprobs(21); }, "logprobs");
}

}  // namespace
}  // namespace switchserve
