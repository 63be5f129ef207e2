// Batch invariance, the backend's half of isolation (docs/design.md): for a
// fixed backend, thread count and weight dtype, a sequence's logits are the
// same bits however its tokens are grouped into steps (one full pass, decode
// token by token, chunks of any size), whatever other sequences share those
// steps and wherever it sits among them, and after its cache blocks are freed
// and it is recomputed into other blocks. Every backend, every architecture
// variant (dropless dispatch, so routing capacity plays no part), f32 and
// bf16 weights.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/model_loader.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kernel_isa.h"
#include "tests/util/backend_harness.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::BackendHarness;
using testing::BackendUnderTest;
using testing::NamedConfig;

// Long enough to cross a 64-query attention tile and many 4-token KV blocks.
constexpr int kTargetLength = 75;
constexpr SequenceId kTarget = 1;

using Param = std::tuple<BackendUnderTest, NamedConfig, WeightsDtype>;

class BatchInvarianceTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    config_ = std::get<1>(GetParam()).config;
    ASSERT_LE(config_.dispatch.capacity_factor, 0) << "the variants are dropless";
    weights_ =
        ConvertWeights(config_, testing::RandomWeights(config_, 17), std::get<2>(GetParam()));
    tokens_ = testing::RandomTokens(kTargetLength, config_.vocab_size, 5);
    BackendHarness full(backend(), config_, weights_, config_.dispatch);
    reference_ = full.Run(kTarget, tokens_, 0);
    ASSERT_EQ(reference_.size(), static_cast<size_t>(kTargetLength) * config_.vocab_size);
  }
  const BackendUnderTest& backend() const { return std::get<0>(GetParam()); }

  // Rows of `logits` (one per position, from `first_position` on) must be
  // the full pass's rows, bit for bit.
  void ExpectReferenceRows(const float* logits, int first_position, int rows,
                           const std::string& how) {
    const int V = config_.vocab_size;
    for (int r = 0; r < rows; ++r) {
      const int p = first_position + r;
      const float* want = reference_.data() + static_cast<int64_t>(p) * V;
      const float* got = logits + static_cast<int64_t>(r) * V;
      if (std::memcmp(want, got, V * sizeof(float)) != 0) {
        int column = 0;
        while (std::memcmp(want + column, got + column, sizeof(float)) == 0) ++column;
        ADD_FAILURE() << how << ": position " << p << " differs from the full pass, first at "
                      << "logit " << column << ": " << got[column] << " vs " << want[column];
        return;
      }
    }
  }

  // The target in chunks of random sizes, each in a step with random
  // neighbours (new prefills, continuing prefills, decodes) placed before and
  // after it. `crowd` > 0: every step holds that many short neighbours, each
  // a prefill or a decode of one or two tokens.
  void RunAmongNeighbours(BackendHarness& harness, uint64_t seed, const std::string& how,
                          int crowd = 0) {
    std::mt19937_64 rng(seed);
    const int V = config_.vocab_size;
    struct Neighbour {
      SequenceId id;
      int length;
    };
    std::vector<Neighbour> neighbours;
    SequenceId next_id = 100 + static_cast<SequenceId>(seed % 1000) * 100;
    for (int p = 0; p < kTargetLength;) {
      const int n = std::min<int>(kTargetLength - p, 1 + static_cast<int>(rng() % 12));
      std::vector<BackendHarness::Chunk> chunks;
      // Keep the cache from filling: neighbours stay short and leave.
      while (neighbours.size() > static_cast<size_t>(crowd > 0 ? crowd : 3) ||
             (!neighbours.empty() && rng() % 4 == 0)) {
        harness.alloc().Free(neighbours.front().id);
        neighbours.erase(neighbours.begin());
      }
      for (size_t i = 0; crowd > 0 && i < neighbours.size();) {
        if (neighbours[i].length > 8) {
          harness.alloc().Free(neighbours[i].id);
          neighbours.erase(neighbours.begin() + i);
        } else {
          ++i;
        }
      }
      for (Neighbour& nb : neighbours) {
        if (crowd == 0 && (rng() % 3 == 0 || nb.length > 20)) continue;  // not in this step
        const int m = crowd > 0        ? 1 + static_cast<int>(rng() % 2)
                      : rng() % 2 == 0 ? 1
                                       : 1 + static_cast<int>(rng() % 9);
        chunks.push_back({nb.id, testing::RandomTokens(m, V, rng()), nb.length,
                          rng() % 2 == 0 ? LogitsMode::kLast : LogitsMode::kNone});
        nb.length += m;
      }
      const int fresh_count =
          crowd > 0 ? crowd - static_cast<int>(neighbours.size()) : static_cast<int>(rng() % 3);
      for (int fresh = fresh_count; fresh > 0; --fresh) {
        const int m = 1 + static_cast<int>(rng() % (crowd > 0 ? 2 : 10));
        neighbours.push_back({next_id, m});
        chunks.push_back({next_id++, testing::RandomTokens(m, V, rng()), 0, LogitsMode::kAll});
      }
      std::shuffle(chunks.begin(), chunks.end(), rng);
      const size_t at = rng() % (chunks.size() + 1);
      chunks.insert(chunks.begin() + at,
                    {kTarget, std::vector<int32_t>(tokens_.begin() + p, tokens_.begin() + p + n), p,
                     LogitsMode::kAll});
      StepOutput out;
      ASSERT_TRUE(harness.Step(chunks, &out).ok());
      // The target's rows: find them by sequence index in the step.
      std::vector<float> rows;
      for (size_t r = 0; r < out.row_sequence.size(); ++r) {
        if (out.row_sequence[r] != static_cast<int>(at)) continue;
        rows.insert(rows.end(), out.logits.begin() + r * V, out.logits.begin() + (r + 1) * V);
      }
      ASSERT_EQ(rows.size(), static_cast<size_t>(n) * V);
      ExpectReferenceRows(rows.data(), p, n,
                          how + " (chunk of " + std::to_string(n) + " among " +
                              std::to_string(chunks.size() - 1) + " neighbours)");
      p += n;
    }
    for (const Neighbour& nb : neighbours) harness.alloc().Free(nb.id);
  }

  ModelConfig config_;
  ModelWeights weights_;
  std::vector<int32_t> tokens_;
  std::vector<float> reference_;
};

TEST_P(BatchInvarianceTest, DecodeTokenByTokenGivesTheFullPassBits) {
  BackendHarness harness(backend(), config_, weights_, config_.dispatch);
  for (int p = 0; p < kTargetLength; ++p) {
    const std::vector<float> row = harness.Run(kTarget, {tokens_[p]}, p);
    ExpectReferenceRows(row.data(), p, 1, "decode");
  }
}

TEST_P(BatchInvarianceTest, ChunksAmongNeighboursGiveTheFullPassBits) {
  BackendHarness harness(backend(), config_, weights_, config_.dispatch);
  RunAmongNeighbours(harness, 1, "first run");
  // Preempted: its blocks go back, and it is recomputed, chunked otherwise,
  // into other blocks among other neighbours.
  harness.alloc().Free(kTarget);
  // Another sequence takes the lowest free blocks, so the table changes.
  ASSERT_TRUE(harness.alloc().Reserve(99, 5 * testing::kHarnessBlockSize).ok());
  RunAmongNeighbours(harness, 2, "recomputed");
}

// Enough sequences in every step that the CPU backend's attention keeps each
// query tile's heads together in one piece of work (paged_attention.h), where
// the full pass takes one head at a time.
TEST_P(BatchInvarianceTest, ChunksAmongManyNeighboursGiveTheFullPassBits) {
  BackendHarness harness(backend(), config_, weights_, config_.dispatch);
  RunAmongNeighbours(harness, 3, "crowded", /*crowd=*/9);
}

// A prompt long enough that the CPU backend routes its rows in ranges on the
// worker pool and dispatches each router in a piece of its own (StepRouters,
// kernels/cpu/cpu_step.h: 160 tokens x 16 logits a module), under a capacity
// that drops and reroutes (sequence scope): in one pass, its logits are those
// of the same prompt in chunks of 8, whose routing one thread does, bit for
// bit. Every CPU backend, the portable build too.
TEST(LongPromptTest, RoutingSharedOutGivesTheBitsOfSmallChunks) {
  ModelConfig config = testing::TinySwitchAllConfig();
  config.ffn.n_experts = 16;
  config.max_seq_len = 160;
  config.dispatch.capacity_factor = 1.0;
  config.dispatch.overflow = OverflowPolicy::kReroute;
  config.dispatch.scope = CapacityScope::kSequence;
  config.dispatch.capacity_group = 32;
  const ModelWeights weights = testing::RandomWeights(config, 23);
  const std::vector<int32_t> tokens =
      testing::RandomTokens(config.max_seq_len, config.vocab_size, 29);
  constexpr int kChunk = 8;
  int tested = 0;
  for (const BackendUnderTest& backend : testing::BackendsUnderTest()) {
    if (backend.name.rfind("cpu", 0) != 0) continue;
    SCOPED_TRACE(backend.name);
    ++tested;
    BackendHarness whole(backend, config, weights, config.dispatch);
    const std::vector<float> full = whole.Run(kTarget, tokens, 0);
    BackendHarness chunked(backend, config, weights, config.dispatch);
    std::vector<float> chunks;
    for (int p = 0; p < static_cast<int>(tokens.size()); p += kChunk) {
      const std::vector<float> rows = chunked.Run(
          kTarget, std::vector<int32_t>(tokens.begin() + p, tokens.begin() + p + kChunk), p);
      chunks.insert(chunks.end(), rows.begin(), rows.end());
    }
    ASSERT_EQ(full.size(), static_cast<size_t>(tokens.size()) * config.vocab_size);
    ASSERT_EQ(chunks.size(), full.size());
    EXPECT_EQ(0, std::memcmp(full.data(), chunks.data(), full.size() * sizeof(float)));
  }
  EXPECT_EQ(tested, 3);
}

// Half-precision weights are widened exactly, in registers or a tile at a
// time: the logits are those of the same values held in f32, bit for bit, in
// a full pass and in decode.
using WideningParam = std::tuple<BackendUnderTest, NamedConfig>;
class HalfWeightsTest : public ::testing::TestWithParam<WideningParam> {};

TEST_P(HalfWeightsTest, GiveTheBitsOfTheirF32Widening) {
  const BackendUnderTest& backend = std::get<0>(GetParam());
  const ModelConfig& config = std::get<1>(GetParam()).config;
  const std::vector<int32_t> tokens = testing::RandomTokens(13, config.vocab_size, 8);
  for (WeightsDtype dtype : {WeightsDtype::kBF16, WeightsDtype::kF16}) {
    SCOPED_TRACE(std::string(ToString(dtype)));
    const ModelWeights half = ConvertWeights(config, testing::RandomWeights(config, 19), dtype);
    const ModelWeights widened = ConvertWeights(config, half, WeightsDtype::kF32);
    ASSERT_NE(half.layers[0].attn.q.dtype(), DType::kF32);
    ASSERT_EQ(widened.layers[0].attn.q.dtype(), DType::kF32);
    BackendHarness a(backend, config, half, config.dispatch);
    BackendHarness b(backend, config, widened, config.dispatch);
    const std::vector<float> full_a = a.Run(kTarget, tokens, 0);
    const std::vector<float> full_b = b.Run(kTarget, tokens, 0);
    ASSERT_EQ(full_a.size(), full_b.size());
    EXPECT_EQ(0, std::memcmp(full_a.data(), full_b.data(), full_a.size() * sizeof(float)))
        << "full pass";
    for (int p = 0; p < 5; ++p) {
      const std::vector<float> row_a = a.Run(2, {tokens[p]}, p);
      const std::vector<float> row_b = b.Run(2, {tokens[p]}, p);
      EXPECT_EQ(0, std::memcmp(row_a.data(), row_b.data(), row_a.size() * sizeof(float)))
          << "decode position " << p;
    }
  }
}

std::string WideningName(const ::testing::TestParamInfo<WideningParam>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Backends, HalfWeightsTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::AllVariantConfigs())),
                         WideningName);

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name + "_" +
         std::string(ToString(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchInvarianceTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::AllVariantConfigs()),
                                            ::testing::Values(WeightsDtype::kF32,
                                                              WeightsDtype::kBF16)),
                         ParamName);

// The same with the CPU backend's KV cache in bf16: rounding keys and values
// as they are written keeps every path over the same cached bits.
INSTANTIATE_TEST_SUITE_P(Bf16KvCache, BatchInvarianceTest,
                         ::testing::Combine(::testing::Values(testing::CpuBf16KvCacheBackend()),
                                            ::testing::ValuesIn(testing::AllVariantConfigs()),
                                            ::testing::Values(WeightsDtype::kBF16)),
                         ParamName);

// Output experts wider than 64 columns: a step's few rows of an expert (5 to
// 24) take the AVX2 kernels' bf16 products that read the weights in place,
// the full pass's many rows the packed ones; the bits must not tell them
// apart. The CPU backends only: the path is theirs.
NamedConfig WideOutputExperts() {
  ModelConfig config = testing::TinySwitchAllConfig();
  config.d_model = 96;
  return {"WideOutputExperts", config};
}

std::vector<BackendUnderTest> CpuBackendsUnderTest() {
  std::vector<BackendUnderTest> out;
  for (const BackendUnderTest& backend : testing::BackendsUnderTest()) {
    if (backend.name.rfind("cpu", 0) == 0) out.push_back(backend);
  }
  // The in-place products are the AVX2 build's (the AVX-512 build packs
  // every rows-in product): the backends above pick AVX-512 where the CPU
  // has it, so the AVX2 build is named here too.
  if (cpu::CpuSupports(cpu::KernelIsa::kAvx2) && cpu::BestKernelIsa() != cpu::KernelIsa::kAvx2) {
    out.push_back(testing::CpuParallelBackend("cpu_avx2", cpu::KernelIsa::kAvx2));
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(InPlaceExperts, BatchInvarianceTest,
                         ::testing::Combine(::testing::ValuesIn(CpuBackendsUnderTest()),
                                            ::testing::Values(WideOutputExperts()),
                                            ::testing::Values(WeightsDtype::kBF16)),
                         ParamName);

}  // namespace
}  // namespace switchserve
