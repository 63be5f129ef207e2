#include "server/http/openai_protocol.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/text/detokenizer.h"
#include "engine/text/tokenizer.h"
#include "server/request_validation.h"
#include "tests/util/test_util.h"

namespace switchserve {
namespace {

// The byte tokenizer's vocabulary, which the refusal of an id past int32
// names.
constexpr int kVocabSize = 256;

absl::StatusOr<CompletionRequest> Parse(std::string_view body) {
  return ParseCompletionRequest(body, kVocabSize);
}

// A body ParseCompletionRequest refuses: INVALID_ARGUMENT (an HTTP 400)
// with exactly `message`.
struct Refusal {
  const char* body;
  const char* message;
};

void ExpectRefused(const Refusal& c) {
  auto refusal = Parse(c.body);
  ASSERT_FALSE(refusal.ok()) << c.body;
  EXPECT_EQ(refusal.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
  EXPECT_EQ(refusal.status().message(), c.message) << c.body;
  EXPECT_EQ(MakeApiError(refusal.status()).http_status, 400) << c.body;
}

TEST(OpenAiProtocolTest, ParsesTheSupportedFieldsIntoGenerateRequests) {
  auto parsed = Parse(R"({
      "model": "m", "prompt": ["a", [1, 2]], "max_tokens": 7, "temperature": 0.5,
      "top_p": 0.9, "n": 3, "stream": true, "stream_options": {"include_usage": true},
      "logprobs": 2, "stop": "\n", "seed": -1, "user": "u", "top_k": -1, "min_p": 0.1,
      "repetition_penalty": 1.2, "ignore_eos": true, "stop_token_ids": [3],
      "echo": true, "best_of": null, "presence_penalty": -0.5, "frequency_penalty": 1.25,
      "logit_bias": {"7": -100, "65": 2.5, "3": null}, "suffix": null,
      "return_tokens_as_token_ids": true, "priority": -4, "cache_salt": "s3cret",
      "return_token_ids": true, "skip_special_tokens": true,
      "spaces_between_special_tokens": false})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model, "m");
  EXPECT_EQ(parsed->n, 3);
  EXPECT_TRUE(parsed->tokens_as_ids);
  EXPECT_TRUE(parsed->return_token_ids);
  EXPECT_TRUE(parsed->echo);
  EXPECT_TRUE(parsed->stream);
  EXPECT_TRUE(parsed->include_usage);
  EXPECT_EQ(parsed->logprobs, 2);
  ASSERT_EQ(parsed->prompts.size(), 2u);
  EXPECT_EQ(parsed->prompts[0].text(), "a");
  EXPECT_EQ(parsed->prompts[1].token_ids().ids_size(), 2);
  for (const auto& prompt : parsed->prompts) {
    const v1::SamplingParams& s = prompt.sampling();
    EXPECT_EQ(s.max_new_tokens(), 7);
    EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
    EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
    EXPECT_EQ(s.top_k(), 0);  // vLLM's -1: off
    EXPECT_FLOAT_EQ(s.min_p(), 0.1f);
    EXPECT_FLOAT_EQ(s.repetition_penalty(), 1.2f);
    EXPECT_EQ(s.seed(), ~uint64_t{0});  // -1 as the unsigned seed
    ASSERT_EQ(s.stop_size(), 1);
    EXPECT_EQ(s.stop(0), "\n");
    EXPECT_TRUE(s.ignore_eos());
    EXPECT_EQ(s.stop_token_ids_size(), 1);
    EXPECT_EQ(s.presence_penalty(), -0.5f);
    EXPECT_EQ(s.frequency_penalty(), 1.25f);
    // null: no bias for that id.
    ASSERT_EQ(s.logit_bias_size(), 2);
    EXPECT_EQ(s.logit_bias().at(7), -100.0f);
    EXPECT_EQ(s.logit_bias().at(65), 2.5f);
    EXPECT_EQ(prompt.logprobs(), 2);
    EXPECT_EQ(prompt.priority(), -4);
    EXPECT_EQ(prompt.cache_salt(), "s3cret");
  }
}

TEST(OpenAiProtocolTest, DefaultsFollowOpenAi) {
  auto parsed = Parse(R"({"prompt": "x", "temperature": null})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->stream);
  EXPECT_FALSE(parsed->logprobs.has_value());
  EXPECT_FALSE(parsed->tokens_as_ids);
  EXPECT_FALSE(parsed->return_token_ids);
  EXPECT_EQ(parsed->n, 1);
  ASSERT_EQ(parsed->prompts.size(), 1u);
  EXPECT_EQ(parsed->prompts[0].sampling().max_new_tokens(), kDefaultMaxTokens);
  EXPECT_FALSE(parsed->prompts[0].sampling().has_temperature());
  EXPECT_FALSE(parsed->prompts[0].sampling().has_seed());
  // null for a stream option is "not given" too (vLLM's Optional[bool]).
  parsed = Parse(R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": null}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->include_usage);
}

// "max_tokens": 0 with echo asks for the prompt alone: the engine is asked
// for one token, which the response leaves out. Without echo it is refused.
TEST(OpenAiProtocolTest, ZeroMaxTokensWithEchoIsThePromptAlone) {
  for (const char* body : {R"({"prompt": "x", "echo": true, "max_tokens": 0})",
                           R"({"max_tokens": 0.0, "prompt": "x", "echo": true})"}) {
    auto parsed = Parse(body);
    ASSERT_TRUE(parsed.ok()) << body << ": " << parsed.status();
    EXPECT_TRUE(parsed->echo_only) << body;
    EXPECT_EQ(parsed->prompts.at(0).sampling().max_new_tokens(), 1) << body;
  }
  auto one = Parse(R"({"prompt": "x", "echo": true, "max_tokens": 1})");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->echo_only);
  ExpectRefused({R"({"prompt": "x", "max_tokens": 0})",
                 "max_tokens: must be in [1, 2147483647], found 0 (0 only with \"echo\": true, "
                 "for the prompt alone)"});
  ExpectRefused({R"({"prompt": "x", "echo": false, "max_tokens": 0})",
                 "max_tokens: must be in [1, 2147483647], found 0 (0 only with \"echo\": true, "
                 "for the prompt alone)"});
}

// best_of may be sent when it asks for no more samples than n: each choice
// is then its own sample, as with n alone.
TEST(OpenAiProtocolTest, BestOfEqualToNIsNAlone) {
  const struct {
    const char* body;
    int n;
  } cases[] = {{R"({"prompt": "x", "n": 4, "best_of": 4})", 4},
               {R"({"prompt": "x", "best_of": 4.0, "n": 4})", 4},
               {R"({"prompt": "x", "best_of": 1})", 1}};
  for (const auto& c : cases) {
    auto parsed = Parse(c.body);
    ASSERT_TRUE(parsed.ok()) << c.body << ": " << parsed.status();
    EXPECT_EQ(parsed->n, c.n) << c.body;
    EXPECT_EQ(parsed->prompts.size(), 1u) << c.body;
  }
}

// Integer fields take a whole number written as a float (pydantic's lax mode,
// vLLM's), and refuse a fraction or a whole number past int64.
TEST(OpenAiProtocolTest, IntegerFieldsTakeWholeFloats) {
  auto parsed = Parse(R"({"prompt": "x", "max_tokens": 2.0, "n": 1.0, "seed": 1e3, "top_k": 4.0})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::SamplingParams& s = parsed->prompts[0].sampling();
  EXPECT_EQ(s.max_new_tokens(), 2);
  EXPECT_EQ(s.seed(), 1000u);
  EXPECT_EQ(s.top_k(), 4);
  EXPECT_EQ(Parse(R"({"prompt": "x", "max_tokens": 2.5})").status().message(),
            "max_tokens: must be an integer, found 2.5");
  EXPECT_EQ(Parse(R"({"prompt": "x", "seed": 1e30})").status().message(),
            "seed: must be in [-9223372036854775808, 18446744073709551615], found 1e+30");
}

// The floating-point fields are checked as sent, in double, before they
// become the engine's floats: a number just outside a range is refused (it
// rounded onto the bound and passed), one inside it is served (top_p 1e-50
// rounded to 0 and was refused as "found 0"), and a temperature past the
// largest float is refused saying so (it was "found inf").
TEST(OpenAiProtocolTest, FloatFieldsAreCheckedAsSentBeforeBecomingFloats) {
  const Refusal refused[] = {
      {R"({"prompt": "x", "top_p": 1.00000001})", "top_p: must be in (0, 1], found 1.00000001"},
      {R"({"prompt": "x", "min_p": 1.00000001})", "min_p: must be in [0, 1], found 1.00000001"},
      {R"({"prompt": "x", "min_p": -1e-50})", "min_p: must be in [0, 1], found -1e-50"},
      {R"({"prompt": "x", "temperature": -1e-50})",
       "temperature: must be a finite value >= 0, found -1e-50"},
      {R"({"prompt": "x", "repetition_penalty": 100.000001})",
       "repetition_penalty: must be in [0.01, 100], found 100.000001"},
      {R"({"prompt": "x", "repetition_penalty": 0.0099999999})",
       "repetition_penalty: must be in [0.01, 100], found 0.0099999999"},
      {R"({"prompt": "x", "top_p": 0})", "top_p: must be in (0, 1], found 0"},
      {R"({"prompt": "x", "temperature": 1e39})",
       "temperature: must be at most 3.4028234663852886e+38 (the largest 32-bit float), found "
       "1e+39"},
      // The float's shortest text, read as a double, is past the bound: the
      // message gave it as the bound.
      {R"({"prompt": "x", "temperature": 3.4028235e38})",
       "temperature: must be at most 3.4028234663852886e+38 (the largest 32-bit float), found "
       "3.4028235e+38"},
  };
  for (const Refusal& c : refused) ExpectRefused(c);

  // In range as sent: served, the float on the same side of every bound.
  auto parsed = Parse(
      R"({"prompt": "x", "top_p": 1e-50, "temperature": 3.4028234663852886e38, "min_p": 1e-50,
          "repetition_penalty": 0.01, "max_tokens": 1})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::SamplingParams& s = parsed->prompts[0].sampling();
  EXPECT_EQ(s.top_p(), std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(s.temperature(), std::numeric_limits<float>::max());
  EXPECT_EQ(s.min_p(), std::numeric_limits<float>::denorm_min());
  const std::unique_ptr<Tokenizer> tokenizer = CreateByteTokenizer();
  auto request = ValidateGenerateRequest(parsed->prompts[0], *tokenizer,
                                         RequestLimits{.vocab_size = 256, .context_length = 64});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_GT(request->sampling.top_p, 0.0f);
  EXPECT_EQ(request->sampling.temperature, std::numeric_limits<float>::max());
  // A positive temperature too small for a float samples; it is not greedy.
  parsed = Parse(R"({"prompt": "x", "temperature": 1e-50})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_GT(parsed->prompts[0].sampling().temperature(), 0.0f);
}

// A number past the largest double (1e400: the infinity that gRPC's float
// fields can hold) is valid JSON that the parser cannot hold: it is refused
// naming the parameter it was sent for, as gRPC names a field sent as
// inf, and showing it shortened (it was "body: is not valid JSON").
TEST(OpenAiProtocolTest, NumbersPastADoubleNameTheirParameter) {
  const Refusal cases[] = {
      {R"({"prompt": "x", "temperature": 1e400})",
       "temperature: is out of range (past the largest double, 1.8e308), found 1e400"},
      {R"({"prompt": "x", "min_p": -1e400})",
       "min_p: is out of range (past the largest double, 1.8e308), found -1e400"},
      {R"({"max_tokens": 1E+999, "prompt": "x"})",
       "max_tokens: is out of range (past the largest double, 1.8e308), found 1E+999"},
      {R"({"prompt": [1, 1e400]})",
       "prompt: is out of range (past the largest double, 1.8e308), found 1e400"},
      {R"({"prompt": ["a", [2, 3e999]]})",
       "prompt: is out of range (past the largest double, 1.8e308), found 3e999"},
      {R"({"prompt": "x", "stop_token_ids": [1e400]})",
       "stop_token_ids: is out of range (past the largest double, 1.8e308), found 1e400"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1e400}})",
       "stream_options.include_usage: is out of range (past the largest double, 1.8e308), "
       "found 1e400"},
      // An unknown field is refused as one, whatever its value.
      {R"({"prompt": "x", "temprature": 1e400})",
       "temprature: unrecognized request argument (docs/serving.md lists the supported ones)"},
      // The body's first error is the one refused: invalid JSON before it.
      {R"({"prompt": "x",, "top_p": 1e400})", "body: is not valid JSON"},
      {R"({"prompt": "x" "top_p": 1e400})", "body: is not valid JSON"},
      {R"({"prompt": "x", "top_p": 1e400 1})",
       "top_p: is out of range (past the largest double, 1.8e308), found 1e400"},
  };
  for (const Refusal& c : cases) ExpectRefused(c);
  for (const Refusal& c : cases) {
    const std::string param =
        MakeApiError(Parse(c.body).status()).body["error"]["param"].get<std::string>();
    EXPECT_EQ(param, std::string(c.message).substr(0, param.size())) << c.body;
  }
  // A long number (an integer of 400 digits overflows the double too) is
  // shown shortened.
  const std::string digits(100000, '9');
  auto parsed = Parse(R"({"prompt": "x", "seed": )" + digits + "}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "seed: is out of range (past the largest double, 1.8e308), found " +
                std::string(60, '9') + "...");
}

// A seed is any integer in [-2^63, 2^64), a negative one taken modulo 2^64,
// also written as a whole float. The JSON reader gives integers just below
// -2^63 as the double -2^63: they were taken as the seed 2^63, against the
// modulo rule (2^63 - 1 for -2^63 - 1), and 1e19 was out of range.
TEST(OpenAiProtocolTest, SeedsAreIntegersFromMinusTwoToThe63ToTwoToThe64) {
  const struct {
    const char* seed;
    uint64_t taken;
  } accepted[] = {
      {"0", 0},
      {"-1", std::numeric_limits<uint64_t>::max()},
      {"18446744073709551615", std::numeric_limits<uint64_t>::max()},
      {"-9223372036854775808", uint64_t{1} << 63},
      {"9223372036854775808", uint64_t{1} << 63},
      {"1e19", 10000000000000000000u},
      {"-2.0", std::numeric_limits<uint64_t>::max() - 1},
  };
  for (const auto& c : accepted) {
    auto parsed = Parse(absl::StrCat(R"({"prompt": "x", "seed": )", c.seed, "}"));
    ASSERT_TRUE(parsed.ok()) << c.seed << ": " << parsed.status();
    EXPECT_EQ(parsed->prompts[0].sampling().seed(), c.taken) << c.seed;
  }
  for (const char* seed :
       {"-9223372036854775809", "-9223372036854776832", "-1e19", "18446744073709551616", "1e30"}) {
    auto refused = Parse(absl::StrCat(R"({"prompt": "x", "seed": )", seed, "}"));
    ASSERT_FALSE(refused.ok()) << seed << " taken as " << refused->prompts[0].sampling().seed();
    EXPECT_TRUE(absl::StartsWith(refused.status().message(),
                                 "seed: must be in [-9223372036854775808, 18446744073709551615], "
                                 "found "))
        << refused.status().message();
  }
}

// So do the integers of lists: token-id prompts and stop_token_ids; a
// fraction is refused naming the element.
TEST(OpenAiProtocolTest, TokenIdListsTakeWholeFloats) {
  auto parsed = Parse(R"({"prompt": [1, 2.0, 3e1], "stop_token_ids": [4.0, 5], "max_tokens": 2})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->prompts.size(), 1u);
  const v1::GenerateRequest& request = parsed->prompts[0];
  EXPECT_EQ(
      std::vector<int32_t>(request.token_ids().ids().begin(), request.token_ids().ids().end()),
      (std::vector<int32_t>{1, 2, 30}));
  EXPECT_EQ(std::vector<int32_t>(request.sampling().stop_token_ids().begin(),
                                 request.sampling().stop_token_ids().end()),
            (std::vector<int32_t>{4, 5}));
  parsed = Parse(R"({"prompt": ["a", [7.0, -0.0]]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->prompts.size(), 2u);
  EXPECT_EQ(parsed->prompts[1].token_ids().ids_size(), 2);
  EXPECT_EQ(parsed->prompts[1].token_ids().ids(0), 7);
  EXPECT_EQ(parsed->prompts[1].token_ids().ids(1), 0);

  const Refusal refused[] = {
      {R"({"prompt": [1, 2.5]})", "prompt: ids[1] must be an integer, found 2.5"},
      {R"({"prompt": ["a", [2.5]]})", "prompt[1]: ids[0] must be an integer, found 2.5"},
      {R"({"prompt": "x", "stop_token_ids": [3, 0.5]})",
       "stop_token_ids: stop_token_ids[1] must be an integer, found 0.5"},
      {R"({"prompt": [1, "2"]})", "prompt: ids[1] must be an integer, found \"2\""},
      // Past int32, refused as the validation refuses the ids past the
      // vocabulary, naming it.
      {R"({"prompt": [5e9]})", "prompt: ids[0] = 5000000000.0 is outside the vocabulary [0, 256)"},
      {R"({"prompt": "x", "stop_token_ids": [-3e9]})",
       "stop_token_ids: stop_token_ids[0] = -3000000000.0 is outside the vocabulary [0, 256)"},
  };
  for (const Refusal& c : refused) ExpectRefused(c);
}

TEST(OpenAiProtocolTest, RefusalsNameTheParameter) {
  const struct {
    const char* body;
    const char* param;
  } cases[] = {
      {"[1]", "body"},
      {"{", "body"},
      {R"({"max_tokens": 3})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, 5000000000]})", "prompt"},
      {R"({"prompt": ["a", 3]})", "prompt[1]"},
      {R"({"prompt": "x", "n": 0})", "n"},
      {R"({"prompt": "x", "n": 129})", "n"},
      {R"({"prompt": "x", "n": 2, "best_of": 3})", "best_of"},
      {R"({"prompt": "x", "best_of": 2})", "best_of"},
      {R"({"prompt": "x", "echo": 1})", "echo"},
      {R"({"prompt": "x", "suffix": "s"})", "suffix"},
      {R"({"prompt": "x", "skip_special_tokens": false})", "skip_special_tokens"},
      {R"({"prompt": "x", "spaces_between_special_tokens": "no"})",
       "spaces_between_special_tokens"},
      {R"({"prompt": "x", "logit_bias": [5, 1]})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"five": 1}})", "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"5": "1"}})", "logit_bias[5]"},
      {R"({"prompt": "x", "logit_bias": {"5": 101}})", "logit_bias[5]"},
      {R"({"prompt": "x", "frequency_penalty": 2.5})", "frequency_penalty"},
      {R"({"prompt": "x", "presence_penalty": "1"})", "presence_penalty"},
      {R"({"prompt": "x", "max_tokens": "9"})", "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "x", "stream": 1})", "stream"},
      {R"({"prompt": "x", "priority": 1.5})", "priority"},
      {R"({"prompt": "x", "priority": 2147483648})", "priority"},
      {R"({"prompt": "x", "cache_salt": 7})", "cache_salt"},
      {R"({"prompt": "x", "return_tokens_as_token_ids": "yes"})", "return_tokens_as_token_ids"},
      {R"({"prompt": "x", "stream_options": {"frobnicate": true}})", "stream_options.frobnicate"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "x", "top_k": -2})", "top_k"},
      {R"({"prompt": "x", "seed": 1.5})", "seed"},
      {R"({"prompt": "x", "stop": [1]})", "stop"},
      {R"({"prompt": "x", "tools": []})", "tools"},
  };
  for (const auto& c : cases) {
    auto parsed = Parse(c.body);
    ASSERT_FALSE(parsed.ok()) << c.body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    const std::string message(parsed.status().message());
    EXPECT_EQ(message.substr(0, message.find(": ")), c.param) << c.body << " -> " << message;
    const ApiError error = MakeApiError(parsed.status());
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.body["error"]["param"], c.param) << message;
    EXPECT_EQ(error.body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(error.body["error"]["code"], "invalid_argument");
  }
}

TEST(OpenAiProtocolTest, RefusalsSayWhatWasSent) {
  const Refusal cases[] = {
      {R"({"prompt": "x", "max_tokens": 2147483648})",
       "max_tokens: must be in [1, 2147483647], found 2147483648"},
      // Past int64 too, the range is named (it was "is out of range").
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})",
       "max_tokens: must be in [1, 2147483647], found 18446744073709551615"},
      {R"({"prompt": "x", "max_tokens": 1e20})",
       "max_tokens: must be in [1, 2147483647], found 1e+20"},
      {R"({"prompt": "x", "max_tokens": -1e20})",
       "max_tokens: must be in [1, 2147483647], found -1e+20"},
      {R"({"prompt": "x", "top_k": 1e20})",
       "top_k: must be in [-1, 2147483647] (-1 or 0: off), found 1e+20"},
      {R"({"prompt": "x", "logprobs": 18446744073709551615})",
       "logprobs: must be in [0, 20], found 18446744073709551615"},
      {R"({"prompt": "x", "logprobs": 1e20})", "logprobs: must be in [0, 20], found 1e+20"},
      {R"({"prompt": "x", "n": 1e20})", "n: must be in [1, 128], found 1e+20"},
      // Checked as sent, before the float: 2.0000000001 rounds to 2.
      {R"({"prompt": "x", "presence_penalty": 2.0000000001})",
       "presence_penalty: must be in [-2, 2], found 2.0000000001"},
      {R"({"prompt": "x", "logit_bias": {"12": -100.5}})",
       "logit_bias[12]: must be in [-100, 100], found -100.5"},
      {R"({"prompt": "x", "logit_bias": {"4294967296": 1}})",
       "logit_bias: the key \"4294967296\" is no token id in [0, 256)"},
      {R"({"prompt": "x", "best_of": 18446744073709551615})",
       "best_of: must be in [1, 128], found 18446744073709551615"},
      {R"({"prompt": "x", "n": 4, "best_of": 8})",
       "best_of: must equal n (4): returning the best of more samples is not supported, found 8"},
      // Just below -2^63 the reader's double is -2^63 itself: past int64,
      // named as that double, not as int64's minimum.
      {R"({"prompt": "x", "n": -9223372036854775809})",
       "n: must be in [1, 128], found -9.223372036854776e+18"},
      {R"({"prompt": "x", "max_tokens": -9223372036854775809})",
       "max_tokens: must be in [1, 2147483647], found -9.223372036854776e+18"},
      {R"({"prompt": "x", "n": -9223372036854775808})",
       "n: must be in [1, 128], found -9223372036854775808"},
      {R"({"prompt": "x", "seed": -1e20})",
       "seed: must be in [-9223372036854775808, 18446744073709551615], found -1e+20"},
      {R"({"prompt": "x", "top_k": 2147483648})",
       "top_k: must be in [-1, 2147483647] (-1 or 0: off), found 2147483648"},
      // logprobs' range is [0, 20] whatever the value (it said [0, 2147483647]
      // below 0 and past int32).
      {R"({"prompt": "x", "logprobs": -1})", "logprobs: must be in [0, 20], found -1"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs: must be in [0, 20], found 21"},
      {R"({"prompt": "x", "logprobs": 2147483648})",
       "logprobs: must be in [0, 20], found 2147483648"},
      // Ids past int32 are outside the vocabulary, also those an int64 read
      // would wrap to -1, named as the validation names it.
      {R"({"prompt": [4294967361]})",
       "prompt: ids[0] = 4294967361 is outside the vocabulary [0, 256)"},
      {R"({"prompt": [7, 18446744073709551615]})",
       "prompt: ids[1] = 18446744073709551615 is outside the vocabulary [0, 256)"},
      {R"({"prompt": [-3000000000]})",
       "prompt: ids[0] = -3000000000 is outside the vocabulary [0, 256)"},
      {R"({"prompt": ["a", [1, 4294967296]]})",
       "prompt[1]: ids[1] = 4294967296 is outside the vocabulary [0, 256)"},
      {R"({"prompt": "x", "stop_token_ids": [1, 4294967296]})",
       "stop_token_ids: stop_token_ids[1] = 4294967296 is outside the vocabulary [0, 256)"},
      {R"({"prompt": "x", "stop_token_ids": ["1"]})",
       "stop_token_ids: stop_token_ids[0] must be an integer, found \"1\""},
      // A list's entry is named, as the validation names a stop string.
      {R"({"prompt": "x", "stop": [1]})", "stop: stop[0] must be a string, found 1"},
      {R"({"prompt": "x", "stop": ["a", null]})", "stop: stop[1] must be a string, found null"},
      {R"({"prompt": [1, 2.5]})", "prompt: ids[1] must be an integer, found 2.5"},
      {R"({"prompt": "x", "stream": {"a": 1}})", "stream: must be true or false, found an object"},
  };
  for (const Refusal& c : cases) ExpectRefused(c);
  // A long value is shown shortened, not echoed whole.
  const std::string long_value(100000, 'a');
  auto parsed = Parse(R"({"prompt": "x", "max_tokens": ")" + long_value + "\"}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_LT(parsed.status().message().size(), 200u) << parsed.status().message().substr(0, 200);
  // So is an unknown field's name: 64 bytes at most, cut between characters
  // (a cut inside "é" would put invalid UTF-8 into the JSON error).
  const std::string name = std::string(63, 'k') + "\xC3\xA9" + std::string(1000, 'k');
  parsed = Parse(R"({"prompt": "x", ")" + name + R"(": 1})");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            std::string(63, 'k') +
                "...: unrecognized request argument (docs/serving.md lists the "
                "supported ones)");
  EXPECT_EQ(MakeApiError(parsed.status()).body["error"]["param"], std::string(63, 'k') + "...");
}

// Deeply nested arrays or objects are refused as a whole (rendering one for a
// message would recurse once per level: 100,000 levels overflowed the stack).
TEST(OpenAiProtocolTest, DeepNestingIsRefusedWithoutRecursion) {
  const auto nested = [](int depth, const std::string& key) {
    std::string body = R"({"prompt": "x", ")";
    body.append(key).append("\": ").append(depth, '[').append("1").append(depth, ']');
    return body.append("}");
  };
  for (const std::string key : {"max_tokens", "stream", "seed", "prompt", "user"}) {
    auto parsed = Parse(nested(200000, key));
    ASSERT_FALSE(parsed.ok()) << key;
    EXPECT_EQ(parsed.status().message(), "body: nests arrays and objects more than 16 levels deep")
        << key;
  }
  // Refused before the body is parsed (the parser builds every level it
  // reads: 300 MB for a 4 MB body of "["), whatever follows the levels.
  EXPECT_EQ(Parse(std::string(17, '[') + "not json").status().message(),
            "body: nests arrays and objects more than 16 levels deep");
  // Brackets inside strings (escaped quotes included) are text, not levels.
  const std::string brackets = std::string(40, '[') + R"(\"{)" + std::string(40, '{');
  EXPECT_TRUE(Parse(R"({"prompt": ")" + brackets + R"("})").ok());
  std::string objects = R"({"prompt": "x", "stream_options": )";
  for (int i = 0; i < 100000; ++i) objects += R"({"a": )";
  objects.append("1").append(100000, '}').append("}");
  EXPECT_EQ(Parse(objects).status().message(),
            "body: nests arrays and objects more than 16 levels deep");
  // A NUL ends nlohmann's input: a valid body followed by one is refused.
  std::string nul = R"({"prompt": "x"})";
  nul.append(1, '\0').append("{{{");
  EXPECT_EQ(Parse(nul).status().message(), "body: is not valid JSON (a NUL byte)");
  // What a request needs passes: a list of prompts of token ids.
  EXPECT_TRUE(Parse(R"({"prompt": [[1, 2], [3]], "max_tokens": 2})").ok());
}

TEST(OpenAiProtocolTest, ValidationFieldsBecomeRequestParameters) {
  auto mapped = [](const char* message, int index = 0, int count = 1) {
    return std::string(ToApiError(absl::InvalidArgumentError(message), index, count).message());
  };
  EXPECT_EQ(mapped("sampling.max_new_tokens: 90 with a prompt of 3 tokens exceeds"),
            "max_tokens: 90 with a prompt of 3 tokens exceeds");
  EXPECT_EQ(mapped("sampling.top_p: must be in (0, 1], found 2"),
            "top_p: must be in (0, 1], found 2");
  EXPECT_EQ(mapped("text: the prompt is empty"), "prompt: the prompt is empty");
  EXPECT_EQ(mapped("token_ids: ids[1] = 300 is outside", 2, 3),
            "prompt[2]: ids[1] = 300 is outside");
  EXPECT_EQ(mapped("text: the prompt has 80 tokens (prompt + max_new_tokens must fit)"),
            "prompt: the prompt has 80 tokens (prompt + max_tokens must fit)");
  EXPECT_EQ(mapped("logprobs: must be in [0, 20], found 50"),
            "logprobs: must be in [0, 20], found 50");
  // Other codes pass unchanged.
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("queue: full"), 0, 1).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(OpenAiProtocolTest, StatusCodesAndErrorTypes) {
  const struct {
    absl::Status status;
    int http;
    const char* type;
  } cases[] = {
      {absl::UnauthenticatedError("invalid bearer token"), 401, "authentication_error"},
      {absl::NotFoundError("model: `x` does not exist"), 404, "not_found_error"},
      {absl::ResourceExhaustedError("the queue is full"), 429, "rate_limit_error"},
      {absl::UnavailableError("draining"), 503, "service_unavailable_error"},
      {absl::InternalError("backend: boom"), 500, "server_error"},
  };
  for (const auto& c : cases) {
    const ApiError error = MakeApiError(c.status);
    EXPECT_EQ(error.http_status, c.http) << c.status;
    EXPECT_EQ(error.body["error"]["type"], c.type) << c.status;
    EXPECT_EQ(error.body["error"]["message"], std::string(c.status.message()));
    EXPECT_TRUE(error.body["error"]["param"].is_null()) << c.status;  // only for 400s
  }
}

TEST(OpenAiProtocolTest, TokenStringsOfByteTokens) {
  const auto tokenizer = CreateByteTokenizer();
  EXPECT_EQ(TokenString(*tokenizer, 'a'), "a");
  EXPECT_EQ(TokenString(*tokenizer, 0xC3), "bytes:\\xc3");
  TextOffset offset;
  offset.characters = 5;
  std::vector<GeneratedTokenInfo> tokens(3);
  tokens[0].token_id = 'h';
  tokens[0].logprob = -0.5f;
  tokens[0].top_logprobs = {{'h', -0.5f}, {'j', -1.5f}};
  tokens[1].token_id = 0xC3;
  tokens[1].logprob = -2.0f;
  tokens[1].top_logprobs = {{0xC3, -2.0f}};
  tokens[2].token_id = 'i';
  tokens[2].logprob = -0.25f;
  const nlohmann::ordered_json logprobs = LogprobsObject(*tokenizer, tokens, 1, false, &offset);
  EXPECT_EQ(logprobs["tokens"], nlohmann::ordered_json({"h", "bytes:\\xc3", "i"}));
  EXPECT_EQ(logprobs["token_logprobs"], nlohmann::ordered_json({-0.5, -2.0, -0.25}));
  // The stray byte is one U+FFFD.
  EXPECT_EQ(logprobs["text_offset"], nlohmann::ordered_json({5, 6, 7}));
  EXPECT_EQ(offset.characters, 8);
  EXPECT_EQ(logprobs["top_logprobs"][0], nlohmann::ordered_json({{"h", -0.5}}));  // top 1 of 2
}

// `text_offset` indexes the choice's text in characters: the byte tokens of
// one character start where it starts, also when a character spans two
// calls (stream events).
TEST(OpenAiProtocolTest, TextOffsetsCountCharacters) {
  const auto tokenizer = CreateByteTokenizer();
  const std::string text =
      "a\xc3\xa9"
      "b\xe2\x82\xac";  // aéb€
  std::vector<GeneratedTokenInfo> first(3), second(text.size() - 3);
  for (size_t i = 0; i < text.size(); ++i) {
    (i < 3 ? first[i] : second[i - 3]).token_id = static_cast<unsigned char>(text[i]);
  }
  TextOffset offset;
  const nlohmann::ordered_json one = LogprobsObject(*tokenizer, first, 0, false, &offset);
  const nlohmann::ordered_json two = LogprobsObject(*tokenizer, second, 0, false, &offset);
  EXPECT_EQ(one["text_offset"], nlohmann::ordered_json({0, 1, 1}));
  EXPECT_EQ(two["text_offset"], nlohmann::ordered_json({2, 3, 3, 3}));
  EXPECT_EQ(offset.characters, 4);
  EXPECT_TRUE(offset.pending.empty());
}

// A token that spells nothing (ids past a byte vocabulary: a control token,
// the model's EOS) starts where the next token that spells something starts:
// after a character that the bytes before it began when the next token
// breaks it (the text "h\uFFFDi", as Python decodes b"h\xc3i" with
// errors="replace") or the text ends there, at it when the next completes it.
TEST(OpenAiProtocolTest, TokensThatSpellNothingStartWhereTheNextStarts) {
  const auto tokenizer = CreateByteTokenizer();
  const struct {
    std::vector<int32_t> ids;
    TextEnd end;
    std::vector<int64_t> offsets;
    int64_t characters;  // of the text so far
  } cases[] = {
      {{'h', 0xC3, 300, 'i'}, TextEnd::kOpen, {0, 1, 2, 2}, 3},  // "h\uFFFDi"
      {{'h', 0xC3, 300, 301, 'i'}, TextEnd::kAfterLast, {0, 1, 2, 2, 2}, 3},
      {{'h', 0xC3, 300, 0xA9}, TextEnd::kOpen, {0, 1, 1, 1}, 2},          // "hé"
      {{'h', 0xE2, 0x82, 300, 'x'}, TextEnd::kOpen, {0, 1, 1, 2, 2}, 3},  // "h\uFFFDx"
      {{'h', 0xC3, 300}, TextEnd::kAfterLast, {0, 1, 2}, 2},              // "h\uFFFD"
      {{'h', 0xC3, 300}, TextEnd::kBeforeLast, {0, 1, 2}, 2},             // 300: EOS
      // A stop token's bytes are not in the text: it does not complete the é.
      {{'h', 0xC3, 0xA9}, TextEnd::kBeforeLast, {0, 1, 2}, 2},
      {{'h', 0xC3, 0xA9}, TextEnd::kAfterLast, {0, 1, 1}, 2},
      // Not known before the next event: where the character starts.
      {{'h', 0xC3, 300}, TextEnd::kOpen, {0, 1, 1}, 1},
      {{300, 'h'}, TextEnd::kOpen, {0, 0}, 1},
  };
  for (const auto& c : cases) {
    std::vector<GeneratedTokenInfo> tokens(c.ids.size());
    for (size_t i = 0; i < c.ids.size(); ++i) tokens[i].token_id = c.ids[i];
    TextOffset offset;
    const nlohmann::ordered_json logprobs =
        LogprobsObject(*tokenizer, tokens, 0, false, &offset, c.end);
    EXPECT_EQ(logprobs["text_offset"], nlohmann::ordered_json(c.offsets))
        << logprobs["tokens"].dump() << " end " << static_cast<int>(c.end);
    EXPECT_EQ(offset.characters, c.characters) << logprobs["tokens"].dump();
  }
  // In two stream events: the second's first token decides the character.
  std::vector<GeneratedTokenInfo> first(2), second(2);
  first[0].token_id = 0xC3;
  first[1].token_id = 300;
  second[0].token_id = 301;
  second[1].token_id = 'i';
  TextOffset offset;
  EXPECT_EQ(LogprobsObject(*tokenizer, first, 0, false, &offset)["text_offset"],
            nlohmann::ordered_json({0, 0}));
  EXPECT_EQ(
      LogprobsObject(*tokenizer, second, 0, false, &offset, TextEnd::kAfterLast)["text_offset"],
      nlohmann::ordered_json({1, 1}));
}

// The model's EOS and a stop_token_ids token end a choice without their
// text, unless include_stop_str_in_output; max_tokens and a stop string
// after the last token's.
TEST(OpenAiProtocolTest, TheTextEndsBeforeAnEosOrStopToken) {
  EXPECT_EQ(TextEndOf(FinishReason::kEos, 7, {}, false), TextEnd::kBeforeLast);
  EXPECT_EQ(TextEndOf(FinishReason::kStop, 7, {3, 7}, false), TextEnd::kBeforeLast);
  EXPECT_EQ(TextEndOf(FinishReason::kStop, 7, {3}, false), TextEnd::kAfterLast);  // a stop string
  EXPECT_EQ(TextEndOf(FinishReason::kLength, 7, {}, false), TextEnd::kAfterLast);
  EXPECT_EQ(TextEndOf(FinishReason::kEos, 7, {}, true), TextEnd::kAfterLast);
  EXPECT_EQ(TextEndOf(FinishReason::kStop, 7, {3, 7}, true), TextEnd::kAfterLast);
}

// Pieces with SentencePiece's leading space: id 1 spells nothing (BOS), 5 is
// "▁coast", 6 is ",".
class LeadingSpaceTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view) const override {
    return std::vector<int32_t>();
  }
  absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view,
                                                   std::vector<size_t>* ends) const override {
    if (ends != nullptr) ends->clear();
    return std::vector<int32_t>();
  }
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    for (const int32_t id : ids) text += PieceBytes(id, text.empty());
    return text;
  }
  std::string_view PieceBytes(int32_t id, bool first) const override {
    if (id == 5) return first ? "coast" : " coast";
    if (id == 6) return ",";
    return "";
  }
  std::string_view kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return 8; }
};

// Offsets index the choice's text, which drops the first piece's leading
// space when the prompt spells nothing (every offset was one too far).
TEST(OpenAiProtocolTest, TextOffsetsFollowTheTextAfterAPromptThatSpellsNothing) {
  const LeadingSpaceTokenizer tokenizer;
  std::vector<GeneratedTokenInfo> tokens(3);
  tokens[0].token_id = 5;
  tokens[1].token_id = 6;
  tokens[2].token_id = 5;
  for (const bool prompt_spells_text : {false, true}) {
    const std::vector<int32_t> prompt = {1, prompt_spells_text ? 5 : 1};
    TextOffset offset;
    offset.text_started = PromptSpellsText(tokenizer, prompt);
    EXPECT_EQ(offset.text_started, prompt_spells_text);
    const nlohmann::ordered_json logprobs = LogprobsObject(tokenizer, tokens, 0, false, &offset);
    // "coast, coast" or " coast, coast"
    EXPECT_EQ(logprobs["text_offset"], prompt_spells_text ? nlohmann::ordered_json({0, 6, 7})
                                                          : nlohmann::ordered_json({0, 5, 6}));
    EXPECT_EQ(logprobs["tokens"], nlohmann::ordered_json({" coast", ",", " coast"}));
  }
}

// An echoed prompt's first token: nothing predicts it, so its logprob and
// alternatives are null; the offsets count from the prompt's start, where
// a SentencePiece piece's leading space is not in the text.
TEST(OpenAiProtocolTest, AnEchoedPromptsFirstTokenHasNullLogprobs) {
  const LeadingSpaceTokenizer tokenizer;
  std::vector<GeneratedTokenInfo> tokens(3);
  tokens[0].token_id = 5;
  tokens[1].token_id = 6;
  tokens[1].logprob = -0.5f;
  tokens[1].top_logprobs = {{6, -0.5f}};
  tokens[2].token_id = 5;
  tokens[2].logprob = -1.5f;
  TextOffset offset;
  const nlohmann::ordered_json logprobs =
      LogprobsObject(tokenizer, tokens, 1, false, &offset, TextEnd::kOpen,
                     /*first_unscored=*/true);
  EXPECT_EQ(logprobs["token_logprobs"], nlohmann::ordered_json({nullptr, -0.5, -1.5}));
  EXPECT_EQ(logprobs["top_logprobs"][0], nullptr);
  EXPECT_EQ(logprobs["top_logprobs"][1], nlohmann::ordered_json({{",", -0.5}}));
  EXPECT_EQ(logprobs["text_offset"], nlohmann::ordered_json({0, 5, 6}));  // "coast, coast"
  EXPECT_EQ(DecodedText(tokenizer, {5, 6, 5}), "coast, coast");
  const nlohmann::ordered_json unechoed = LogprobsObject(tokenizer, tokens, 1, false, &offset);
  EXPECT_EQ(unechoed["token_logprobs"][0], 0.0);
}

// A prompt whose last bytes end no character: one U+FFFD for them, as the
// text's end.
TEST(OpenAiProtocolTest, AnEchoedPromptEndsWithWholeCharacters) {
  const auto tokenizer = CreateByteTokenizer();
  EXPECT_EQ(DecodedText(*tokenizer, {'a', 0xc3, 0xa9, 'b', 0xe2, 0x82}),
            "a\xc3\xa9"
            "b\xef\xbf\xbd");  // aéb and U+FFFD
}

// A token's alternatives come most likely first, as the engine ranks them
// (OpenAI's order; a JSON object sorted by key would put "b" first).
TEST(OpenAiProtocolTest, TopLogprobsKeepTheirRank) {
  const auto tokenizer = CreateByteTokenizer();
  std::vector<GeneratedTokenInfo> tokens(1);
  tokens[0].token_id = 'z';
  tokens[0].logprob = -0.25f;
  tokens[0].top_logprobs = {{'z', -0.25f}, {'b', -2.5f}, {'m', -3.0f}};
  TextOffset offset;
  const nlohmann::ordered_json logprobs = LogprobsObject(*tokenizer, tokens, 3, false, &offset);
  EXPECT_EQ(logprobs["top_logprobs"][0].dump(), R"({"z":-0.25,"b":-2.5,"m":-3.0})");
}

// Alternatives that spell the same text (here ids past a byte vocabulary,
// which spell nothing) share one key, the most likely's; with
// return_tokens_as_token_ids every token has a key of its own.
TEST(OpenAiProtocolTest, TokensAsIdsKeepAlternativesThatSpellTheSameText) {
  const auto tokenizer = CreateByteTokenizer();
  std::vector<GeneratedTokenInfo> tokens(1);
  tokens[0].token_id = 300;
  tokens[0].logprob = -0.5f;
  tokens[0].top_logprobs = {{300, -0.5f}, {301, -1.5f}, {'x', -2.0f}};
  TextOffset offset;
  const nlohmann::ordered_json as_text = LogprobsObject(*tokenizer, tokens, 3, false, &offset);
  EXPECT_EQ(as_text["tokens"], nlohmann::ordered_json({""}));
  EXPECT_EQ(as_text["top_logprobs"][0].dump(), R"({"":-0.5,"x":-2.0})");
  const nlohmann::ordered_json as_ids = LogprobsObject(*tokenizer, tokens, 3, true, &offset);
  EXPECT_EQ(as_ids["tokens"], nlohmann::ordered_json({"token_id:300"}));
  EXPECT_EQ(as_ids["top_logprobs"][0].dump(),
            R"({"token_id:300":-0.5,"token_id:301":-1.5,"token_id:120":-2.0})");
}

// SentencePiece pieces are named by the text they add after other text, so
// "▁o" and "o" stay two tokens.
TEST(OpenAiProtocolTest, TokenStringsOfSentencePieces) {
  auto tokenizer =
      LoadSentencePieceTokenizer(testing::SourcePath("tests/data/spm/tokenizer.model"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> mill = *(*tokenizer)->Encode("mill");
  ASSERT_EQ(mill.size(), 1u);
  EXPECT_EQ(TokenString(**tokenizer, mill[0]), " mill");
  const std::vector<int32_t> ids = *(*tokenizer)->Encode("the old mill");
  std::string joined;
  for (int32_t id : ids) joined += TokenString(**tokenizer, id);
  EXPECT_EQ(joined, " the old mill");
}

}  // namespace
}  // namespace switchserve
