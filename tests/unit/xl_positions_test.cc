// XL relative positions (attention.position "xl") on every backend
// (BackendsUnderTest()) against the naive float64 reference
// (tests/util/naive_reference.h), on the XL variants of tests/util/random_model.h
// (heads, experts, k, head sizes other than d / H): sequences past several KV
// blocks, query tiles and prefill chunks; decoding equal to one full pass;
// single-token sequences. The model-level checks of every variant (decode and
// chunked prefill, mixed batches, goldens) are in backend_test.cc,
// backend_reference_test.cc and golden_parity_test.cc.
//
// Tolerance: max |ours - reference| / max |reference| over the logits <=
// kXlTolerance, f32 arithmetic against float64 (measured on the CPU backend:
// at most 2.8e-7).
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/runtime/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/util/backend_harness.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/naive_reference.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::BackendUnderTest;
using testing::NaiveLogits;
using testing::NamedConfig;
using testing::RandomTokens;
using testing::RandomWeights;
using testing::RelError;
using testing::Slice;
using Harness = testing::BackendHarness;

constexpr double kXlTolerance = 1e-5;

std::vector<NamedConfig> XlConfigs() {
  std::vector<NamedConfig> xl;
  for (NamedConfig& named : testing::AllVariantConfigs()) {
    if (named.config.attention.IsXl()) xl.push_back(std::move(named));
  }
  return xl;
}

// Parameter: (backend, XL model variant).
class XlPositionsTest : public ::testing::TestWithParam<std::tuple<BackendUnderTest, NamedConfig>> {
 protected:
  const BackendUnderTest& backend() const { return std::get<0>(GetParam()); }
  // The variant with room for the long sequences below.
  ModelConfig config() const {
    ModelConfig config = std::get<1>(GetParam()).config;
    config.max_seq_len = 200;
    return config;
  }
  std::unique_ptr<SequenceRunner> Runner(Backend* backend, const ModelConfig& config,
                                         int prefill_chunk) const {
    SequenceRunnerOptions options;
    options.block_size = 16;
    options.prefill_chunk = prefill_chunk;
    absl::StatusOr<std::unique_ptr<SequenceRunner>> runner =
        SequenceRunner::Create(backend, config, options);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }
};

// 150 tokens: 10 KV blocks of 16, three query tiles of 64, prefill chunks of
// 40 (ending mid-block and mid-tile). Every position's logits are the naive
// reference's, however the prefill was chunked.
TEST_P(XlPositionsTest, LongChunkedPrefillMatchesNaiveReference) {
  const ModelConfig config = this->config();
  const ModelWeights weights = RandomWeights(config, 23);
  const std::vector<int32_t> tokens = RandomTokens(150, config.vocab_size, 29);
  const std::vector<float> want = NaiveLogits(config, weights, tokens);
  for (int chunk : {150, 40, 7}) {
    std::unique_ptr<Backend> created = backend().create(config, weights, config.dispatch);
    std::unique_ptr<SequenceRunner> runner = Runner(created.get(), config, chunk);
    ASSERT_NE(runner, nullptr);
    absl::StatusOr<std::vector<float>> got = runner->Append(0, tokens, /*all_logits=*/true);
    ASSERT_TRUE(got.ok()) << got.status();
    const double error = RelError(*got, want);
    EXPECT_LE(error, kXlTolerance) << "prefill chunk " << chunk;
    std::cout << "[ measured ] " << std::get<1>(GetParam()).name << " prefill chunk " << chunk
              << ": relative error " << error << "\n";
  }
}

// Decoding token by token after a prompt gives, at every position, the logits
// of one full pass over the same tokens, and both are the reference's.
TEST_P(XlPositionsTest, IncrementalDecodingEqualsFullPass) {
  const ModelConfig config = this->config();
  const ModelWeights weights = RandomWeights(config, 31);
  const int V = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(90, V, 37);
  Harness full(backend(), config, weights, config.dispatch);
  const std::vector<float> reference = full.Run(1, tokens, 0);
  EXPECT_LE(RelError(reference, NaiveLogits(config, weights, tokens)), kXlTolerance);

  std::unique_ptr<Backend> created = backend().create(config, weights, config.dispatch);
  std::unique_ptr<SequenceRunner> runner = Runner(created.get(), config, 512);
  ASSERT_NE(runner, nullptr);
  const int prompt = 20;
  absl::StatusOr<std::vector<float>> got = runner->Append(
      0, std::vector<int32_t>(tokens.begin(), tokens.begin() + prompt), /*all_logits=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = prompt; i < tokens.size(); ++i) {
    absl::StatusOr<std::vector<float>> row = runner->Append(0, {tokens[i]}, false);
    ASSERT_TRUE(row.ok()) << row.status();
    got->insert(got->end(), row->begin(), row->end());
  }
  ASSERT_EQ(got->size(), reference.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_LE(RelError(Slice(*got, i, V), Slice(reference, i, V)), kXlTolerance)
        << "position " << i;
  }
}

// A sequence of one token (the official XL module fails on a key length of
// one): alone in a fresh cache, beside a longer sequence in the same step, and
// decoded from there.
TEST_P(XlPositionsTest, SingleTokenSequences) {
  const ModelConfig config = this->config();
  const ModelWeights weights = RandomWeights(config, 41);
  const int V = config.vocab_size;
  const std::vector<int32_t> one = {static_cast<int32_t>(7 % V)};
  const std::vector<int32_t> other = RandomTokens(12, V, 43);

  Harness alone(backend(), config, weights, config.dispatch);
  const std::vector<float> first = alone.Run(1, one, 0);
  EXPECT_LE(RelError(first, NaiveLogits(config, weights, one)), kXlTolerance);

  Harness batched(backend(), config, weights, config.dispatch);
  StepOutput out;
  ASSERT_TRUE(
      batched.Step({{2, other, 0, LogitsMode::kLast}, {1, one, 0, LogitsMode::kAll}}, &out).ok());
  ASSERT_EQ(out.logits.size(), 2u * V);
  EXPECT_LE(RelError(Slice(out.logits, 1, V), first), kXlTolerance);

  std::vector<int32_t> grown = one;
  for (int i = 1; i < 4; ++i) {
    grown.push_back(static_cast<int32_t>((13 * i) % V));
    const std::vector<float> row = batched.Run(1, {grown.back()}, i);
    EXPECT_LE(RelError(row, Slice(NaiveLogits(config, weights, grown), i, V)), kXlTolerance)
        << "decode " << i;
  }
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<BackendUnderTest, NamedConfig>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}
INSTANTIATE_TEST_SUITE_P(Backends, XlPositionsTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(XlConfigs())),
                         TestName);

}  // namespace
}  // namespace switchserve
