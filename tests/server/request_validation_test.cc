#include "server/request_validation.h"

#include <functional>
#include <limits>
#include <set>
#include <string>

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
