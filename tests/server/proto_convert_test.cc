// The engine's structs as the gRPC response carries them (server/proto_convert.h).
#include "server/proto_convert.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/util/random_model.h"

namespace switchserve {
namespace {

// Each alternative is named by its own text, and each routed choice by its
// own fate: kept, rerouted and dropped are three different words.
TEST(ProtoConvertTest, AlternativesAndRoutingFatesAreEachTheirOwn) {
  const std::unique_ptr<Tokenizer> tokenizer = CreateByteTokenizer();
  TokenDescriber describer{.tokenizer = tokenizer.get(),
                           .layout = RouterLayout(testing::TinySwitchAllConfig())};
  GenerationUpdate update;
  GeneratedTokenInfo& info = update.tokens.emplace_back();
  info.token_id = 'a';
  info.logprob = -0.25f;
  info.top_logprobs = {{'a', -0.25f}, {'b', -2.0f}, {'c', -3.0f}};
  const RouteFate fates[] = {RouteFate::kKept, RouteFate::kRerouted, RouteFate::kDropped};
  for (int i = 0; i < describer.layout.choices_per_token(); ++i) {
    info.routing.choices.push_back({.expert = i % 2, .gate = 0.5f, .fate = fates[i % 3]});
  }
  SamplingParams params;
  params.logprobs = 3;
  params.return_routing = true;
  v1::GenerateResponse response;
  AppendTokens(update, params, describer, response.mutable_token_ids(), response.mutable_tokens());
  ASSERT_EQ(response.tokens_size(), 1);
  const v1::GeneratedToken& token = response.tokens(0);
  ASSERT_EQ(token.top_logprobs_size(), 3);
  EXPECT_EQ(token.top_logprobs(0).text(), "a");
  EXPECT_EQ(token.top_logprobs(1).text(), "b");
  EXPECT_EQ(token.top_logprobs(2).text(), "c");
  EXPECT_EQ(token.top_logprobs(1).token_id(), 'b');
  int i = 0;
  const char* names[] = {"kept", "rerouted", "dropped"};
  for (const v1::RouterChoice& router : token.routing().routers()) {
    for (const v1::ExpertChoice& expert : router.experts()) {
      EXPECT_EQ(expert.fate(), names[i % 3]) << i;
      ++i;
    }
  }
  EXPECT_EQ(i, describer.layout.choices_per_token());
  EXPECT_GE(i, 3);
}

}  // namespace
}  // namespace switchserve
