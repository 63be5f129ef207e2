// The CUDA backend's consistency, bitwise (stronger than the shared suites'
// tolerances): decoding token by token and prefilling in chunks give exactly
// the full pass's logits; a sequence's logits do not change with its
// neighbours or its row; a decode step padded to its graph bucket returns
// exactly what the unpadded step returns; a sequence that starts from blocks
// another computed (prefix caching) gets the full pass's logits. In the 16-bit and f32 formats, on
// every architecture variant, dropless and under the sequence capacity scope
// with small groups and capacities (the step scope shares slots between
// sequences by definition).
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/util/backend_harness.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::BackendHarness;
using testing::FloatBytes;
using testing::NamedConfig;
using testing::RandomTokens;
using testing::RandomWeights;

// The dispatches under which a sequence's routing is its own: dropless, and
// the sequence scope with groups of 4 positions and a capacity small enough
// that assignments overflow (kept in the model's overflow policy).
std::vector<std::pair<std::string, DispatchConfig>> PerSequenceDispatches(
    const DispatchConfig& model) {
  DispatchConfig dropless = model;
  dropless.capacity_factor = 0;
  DispatchConfig sequence = model;
  sequence.scope = CapacityScope::kSequence;
  sequence.capacity_factor = 0.5;
  sequence.capacity_group = 4;
  sequence.min_capacity = 0;
  return {{"dropless", dropless}, {"sequence scope", sequence}};
}

// Parameter: (variant, 16-bit weights).
class CudaConsistencyTest : public ::testing::TestWithParam<std::tuple<NamedConfig, bool>> {
 protected:
  const ModelConfig& config() const { return std::get<0>(GetParam()).config; }
  // Sequence a alone, then beside b and c, under `dispatch`.
  void CheckNeighbours(const ModelConfig& config, const ModelWeights& weights,
                       const DispatchConfig& dispatch, const std::vector<int32_t>& a,
                       const std::vector<int32_t>& b, const std::vector<int32_t>& c) const;
  // Decode steps padded to their graph bucket and not, under `dispatch`.
  void CheckGraphPadding(const ModelConfig& config, const ModelWeights& weights,
                         const DispatchConfig& dispatch) const;
  testing::BackendUnderTest backend(bool graphs = true) const {
    CudaBackendOptions options =
        std::get<1>(GetParam()) ? testing::Cuda16BitOptions() : testing::CudaF32Options();
    options.decode_graphs = graphs;
    return testing::CudaBackendWith(options, "cuda");
  }
};

TEST_P(CudaConsistencyTest, DecodeAndChunksGiveTheFullPassBitwise) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 101);
  const int n = 23, V = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(n, V, 102);

  BackendHarness full(backend(), config, weights, config.dispatch);
  const std::vector<float> reference = full.Run(1, tokens, 0);

  BackendHarness decode(backend(), config, weights, config.dispatch);
  for (int i = 0; i < n; ++i) {
    const std::vector<float> row = decode.Run(1, {tokens[i]}, i);
    EXPECT_EQ(FloatBytes(row, 0, V), FloatBytes(reference, static_cast<size_t>(i) * V, V))
        << "position " << i;
  }

  BackendHarness chunked(backend(), config, weights, config.dispatch);
  int start = 0;
  for (const int size : {5, 9, 9}) {
    const std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + start + size);
    const std::vector<float> got = chunked.Run(1, chunk, start);
    EXPECT_EQ(FloatBytes(got, 0, got.size()),
              FloatBytes(reference, static_cast<size_t>(start) * V, got.size()))
        << "chunk at " << start;
    start += size;
  }
}

TEST_P(CudaConsistencyTest, NeighboursDoNotChangeASequencesLogits) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 103);
  const int V = config.vocab_size;
  const std::vector<int32_t> a = RandomTokens(12, V, 104), b = RandomTokens(7, V, 105),
                             c = RandomTokens(10, V, 106);
  for (const auto& [dispatch_name, dispatch] : PerSequenceDispatches(config.dispatch)) {
    SCOPED_TRACE(dispatch_name);
    CheckNeighbours(config, weights, dispatch, a, b, c);
  }
}

void CudaConsistencyTest::CheckNeighbours(const ModelConfig& config, const ModelWeights& weights,
                                          const DispatchConfig& dispatch,
                                          const std::vector<int32_t>& a,
                                          const std::vector<int32_t>& b,
                                          const std::vector<int32_t>& c) const {
  const int V = config.vocab_size;

  // a alone: a prefill of 9, then 3 decode steps.
  BackendHarness alone(backend(), config, weights, dispatch);
  std::vector<float> want = alone.Run(1, {a.begin(), a.begin() + 9}, 0);
  for (int i = 9; i < 12; ++i) {
    const std::vector<float> row = alone.Run(1, {a[i]}, i);
    want.insert(want.end(), row.begin(), row.end());
  }

  // a among others, at another row each step, in decode graphs and without.
  for (const bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "decode graphs" : "eager");
    BackendHarness busy(backend(graphs), config, weights, dispatch);
    StepOutput out;
    ASSERT_TRUE(busy.Step({{2, b, 0, LogitsMode::kNone},
                           {1, {a.begin(), a.begin() + 9}, 0, LogitsMode::kAll},
                           {3, {c.begin(), c.begin() + 4}, 0, LogitsMode::kLast}},
                          &out)
                    .ok());
    std::vector<float> got(out.logits.begin(), out.logits.begin() + 9 * V);
    // Decode a beside b's decode (a first), then beside c's chunk, then alone
    // among three decodes.
    ASSERT_TRUE(
        busy.Step({{1, {a[9]}, 9, LogitsMode::kLast}, {2, {b[0]}, 7, LogitsMode::kLast}}, &out)
            .ok());
    got.insert(got.end(), out.logits.begin(), out.logits.begin() + V);
    ASSERT_TRUE(busy.Step({{3, {c.begin() + 4, c.end()}, 4, LogitsMode::kAll},
                           {1, {a[10]}, 10, LogitsMode::kLast}},
                          &out)
                    .ok());
    got.insert(got.end(), out.logits.end() - V, out.logits.end());
    ASSERT_TRUE(busy.Step({{2, {b[1]}, 8, LogitsMode::kLast},
                           {3, {c[0]}, 10, LogitsMode::kNone},
                           {1, {a[11]}, 11, LogitsMode::kLast}},
                          &out)
                    .ok());
    got.insert(got.end(), out.logits.end() - V, out.logits.end());
    ASSERT_EQ(got.size(), want.size());
    for (size_t row = 0; row < got.size() / V; ++row) {
      EXPECT_EQ(FloatBytes(got, row * V, V), FloatBytes(want, row * V, V)) << "row " << row;
    }
  }
}

// Prefix caching at the backend: sequence 2's block table starts with the
// three blocks sequence 1 computed, and its chunk after them gives the full
// pass's logits. The prefix ends inside a capacity group of 8 under the
// sequence scope, so sequence 2 starts with the group's loads sequence 1
// carried there, as the engine hands them over.
TEST_P(CudaConsistencyTest, ASequenceFromAnothersCachedBlocksGetsTheFullPass) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 107);
  const int n = 23, V = config.vocab_size, prefix = 12;
  const std::vector<int32_t> tokens = RandomTokens(n, V, 108);
  for (auto [dispatch_name, dispatch] : PerSequenceDispatches(config.dispatch)) {
    SCOPED_TRACE(dispatch_name);
    if (dispatch.CarriesGroupLoads()) dispatch.capacity_group = 8;
    BackendHarness full(backend(), config, weights, dispatch);
    const std::vector<float> reference = full.Run(1, tokens, 0);

    BackendHarness cached(backend(), config, weights, dispatch, /*prefix_caching=*/true);
    cached.Run(1, {tokens.begin(), tokens.begin() + prefix}, 0);
    // Only the last block ends where sequence 1's loads are known.
    const int64_t blocks = prefix / testing::kHarnessBlockSize;
    for (int64_t index = 0; index < blocks; ++index) {
      const bool last = index == blocks - 1;
      cached.alloc().CacheBlock(1, index, tokens, /*resumable=*/last,
                                last ? cached.group_loads(1).loads : std::vector<int32_t>());
    }
    const PrefixHit hit = cached.alloc().FindPrefix(tokens, n - 1);
    ASSERT_EQ(hit.tokens, prefix);
    cached.alloc().AttachPrefix(2, hit);
    cached.group_loads(2) = {hit.tokens, hit.loads};
    EXPECT_EQ(cached.alloc().BlockTable(2), cached.alloc().BlockTable(1));
    const std::vector<float> got = cached.Run(2, {tokens.begin() + prefix, tokens.end()}, prefix);
    EXPECT_EQ(FloatBytes(got, 0, got.size()),
              FloatBytes(reference, static_cast<size_t>(prefix) * V, got.size()));
  }
}

// Decode steps of 3 and 5 sequences (buckets 4 and 8) with sampling and
// routing: padded to the bucket or not, the same bytes come back.
TEST_P(CudaConsistencyTest, GraphPaddingChangesNothing) {
  const ModelConfig& config = this->config();
  const ModelWeights weights = RandomWeights(config, 107);
  for (const auto& [dispatch_name, dispatch] : PerSequenceDispatches(config.dispatch)) {
    SCOPED_TRACE(dispatch_name);
    CheckGraphPadding(config, weights, dispatch);
  }
}

void CudaConsistencyTest::CheckGraphPadding(const ModelConfig& config, const ModelWeights& weights,
                                            const DispatchConfig& dispatch) const {
  const int V = config.vocab_size;
  SamplingParams hot;
  hot.temperature = 0.8f;
  hot.top_p = 0.9f;
  hot.logprobs = 2;
  std::vector<std::string> outputs[2];
  for (const bool graphs : {true, false}) {
    BackendHarness h(backend(graphs), config, weights, dispatch);
    std::vector<SamplerRng> rngs;
    for (int s = 0; s < 5; ++s) rngs.emplace_back(40 + s);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<BackendHarness::Chunk> prefill;
    for (int s = 0; s < 5; ++s) prompts.push_back(RandomTokens(3 + s, V, 110 + s));
    for (int s = 0; s < 5; ++s) prefill.push_back({s, prompts[s], 0, LogitsMode::kNone});
    StepOutput out;
    ASSERT_TRUE(h.Step(prefill, &out).ok());
    std::vector<int> next(5);
    for (int s = 0; s < 5; ++s) next[s] = static_cast<int>(prompts[s].size());
    for (int step = 0; step < 3; ++step) {
      const int n = step == 1 ? 3 : 5;
      std::vector<BackendHarness::Chunk> decode;
      for (int s = 0; s < n; ++s) {
        BackendHarness::Chunk chunk{s, {static_cast<int32_t>((s + step) % V)}, next[s]++};
        chunk.logits = s % 2 == 0 ? LogitsMode::kLast : LogitsMode::kNone;
        chunk.collect = s == 1;
        chunk.sample = {&hot, prompts[s], &rngs[s]};
        decode.push_back(chunk);
      }
      const absl::Status status = h.Step(decode, &out);
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(out.samples.size(), static_cast<size_t>(n));
      outputs[graphs ? 0 : 1].push_back(testing::OutputBytes(out));
    }
  }
  ASSERT_EQ(outputs[0].size(), outputs[1].size());
  for (size_t i = 0; i < outputs[0].size(); ++i) {
    EXPECT_TRUE(outputs[0][i] == outputs[1][i]) << "decode step " << i;
  }
}

std::string TestName(const ::testing::TestParamInfo<std::tuple<NamedConfig, bool>>& info) {
  return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_16bit" : "_f32");
}
INSTANTIATE_TEST_SUITE_P(Variants, CudaConsistencyTest,
                         ::testing::Combine(::testing::ValuesIn(testing::AllVariantConfigs()),
                                            ::testing::Bool()),
                         TestName);

}  // namespace
}  // namespace switchserve
