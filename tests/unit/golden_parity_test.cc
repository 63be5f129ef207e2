// Every backend (BackendsUnderTest()) against the Python reference's golden
// vectors (tools/reference/make_goldens.py, computed in float64).
//
// Tolerances: logits, gate values and probability sums within a relative
// error of 1e-4 (max |ours - golden| / max |golden|, f32 arithmetic against a
// float64 reference); routing decisions, capacity counts and the routing trace
// exactly (the goldens are generated with every routing margin > 1e-3, so f32
// rounding cannot flip a decision).
#include <cmath>
#include <memory>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/golden.h"

namespace switchserve {
namespace {

using testing::GoldenCase;
using testing::LoadGolden;

constexpr double kRelativeTolerance = 1e-4;

double RelativeError(const float* ours, const float* golden, size_t n) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(ours[i]) - golden[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(golden[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

TEST(GoldenSetTest, CoversEveryVariant) {
  const std::vector<std::string> variants = testing::ListGoldenVariants();
  for (const char* required :
       {"switchhead_sigmoid", "switchhead_e1", "switchhead_softmax_topk",
        "switchhead_shared_router", "switchhead_gqa", "switchhead_dest_values", "dense_mha",
        "dense_gqa", "switch_ffn_top1_drop", "switch_ffn_top2_drop", "switch_ffn_top1_reroute",
        "switch_ffn_top2_reroute", "switch_ffn_dropless_renorm", "sigma_moe", "switchall_capacity",
        "switchall_bf16", "switchall_f16"}) {
    EXPECT_NE(std::find(variants.begin(), variants.end(), required), variants.end())
        << "missing golden variant " << required;
  }
}

// Parameter: (backend, golden variant).
class GoldenParityTest
    : public ::testing::TestWithParam<std::tuple<testing::BackendUnderTest, std::string>> {
 protected:
  void SetUp() override {
    absl::StatusOr<GoldenCase> golden = LoadGolden(std::get<1>(GetParam()));
    ASSERT_TRUE(golden.ok()) << golden.status();
    golden_ = *std::move(golden);
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(golden_.model_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  std::unique_ptr<Backend> NewBackend() const {
    return std::get<0>(GetParam()).create(model_->config, model_->weights, model_->config.dispatch);
  }

  GoldenCase golden_;
  std::unique_ptr<Model> model_;
};

// All sequences in one engine step, as the reference ran them.
TEST_P(GoldenParityTest, OneStepMatchesReference) {
  const int vocab = model_->config.vocab_size;
  std::unique_ptr<Backend> backend = NewBackend();
  KvCacheOptions options;
  options.block_size = 16;
  options.max_tokens = 64 * 16;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend.get(), options);
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  KvBlockAllocator& allocator = (*kv_cache)->allocator();
  StepBatch batch;
  batch.Clear(allocator.block_size());
  for (size_t s = 0; s < golden_.sequences.size(); ++s) {
    ASSERT_TRUE(allocator.Reserve(s, golden_.sequences[s].size()).ok());
    StepSequence& sequence = batch.Add(golden_.sequences[s], 0, allocator.BlockTable(s));
    sequence.logits = LogitsMode::kAll;
    sequence.collect_routing = true;
  }
  StepOutput output;
  ASSERT_TRUE(backend->Forward(batch, &output).ok());
  ASSERT_EQ(output.logits.size(), golden_.logits.size());
  EXPECT_LE(RelativeError(output.logits.data(), golden_.logits.data(), golden_.logits.size()),
            kRelativeTolerance);

  ASSERT_EQ(output.stats.routers.size(), golden_.routers.size());
  const size_t total_tokens = golden_.logits.size() / vocab;
  ASSERT_EQ(output.routing.size(), total_tokens);
  size_t choice_offset = 0;
  for (size_t r = 0; r < golden_.routers.size(); ++r) {
    const testing::GoldenRouter& want = golden_.routers[r];
    const RouterStepStats& got = output.stats.routers[r];
    SCOPED_TRACE(absl::StrCat("layer ", want.id.layer, " ", std::string(ToString(want.id.module)),
                              " head ", want.id.head));
    EXPECT_EQ(got.tokens, want.stats.tokens);
    EXPECT_EQ(got.routed, want.stats.routed);
    EXPECT_EQ(got.kept, want.stats.kept);
    EXPECT_EQ(got.rerouted, want.stats.rerouted);
    EXPECT_EQ(got.dropped, want.stats.dropped);
    ASSERT_EQ(got.prob_sum.size(), want.stats.prob_sum.size());
    for (size_t e = 0; e < got.prob_sum.size(); ++e) {
      EXPECT_NEAR(got.prob_sum[e], want.stats.prob_sum[e],
                  kRelativeTolerance * std::max(1.0, std::abs(want.stats.prob_sum[e])));
    }
    EXPECT_NEAR(ComputeBalance(got, want.id.top_k).aux_loss, want.aux_loss,
                kRelativeTolerance * want.aux_loss);
    const int k = want.id.top_k;
    for (size_t t = 0; t < total_tokens; ++t) {
      for (int i = 0; i < k; ++i) {
        const RouteChoice& choice = output.routing[t].choices[choice_offset + i];
        EXPECT_EQ(choice.expert, want.expert[t * k + i]) << "token " << t << " rank " << i;
        EXPECT_EQ(static_cast<int>(choice.fate), want.fate[t * k + i]) << "token " << t;
        EXPECT_NEAR(choice.gate, want.gate[t * k + i], kRelativeTolerance) << "token " << t;
      }
    }
    choice_offset += k;
  }
}

// Without capacity limits a sequence's logits do not depend on the batch:
// decoding each sequence alone, one token at a time through the paged cache,
// reproduces the reference's batched logits.
using GoldenDroplessTest = GoldenParityTest;

TEST_P(GoldenDroplessTest, DecodeAloneMatchesReference) {
  ASSERT_TRUE(model_->config.dispatch.Dropless());
  const int vocab = model_->config.vocab_size;
  size_t row = 0;
  for (size_t s = 0; s < golden_.sequences.size(); ++s) {
    std::unique_ptr<Backend> backend = NewBackend();
    absl::StatusOr<std::unique_ptr<SequenceRunner>> runner =
        SequenceRunner::Create(backend.get(), model_->config);
    ASSERT_TRUE(runner.ok()) << runner.status();
    for (int32_t token : golden_.sequences[s]) {
      absl::StatusOr<std::vector<float>> logits = (*runner)->Append(0, {token}, false);
      ASSERT_TRUE(logits.ok()) << logits.status();
      EXPECT_LE(RelativeError(logits->data(), golden_.logits.data() + row * vocab, vocab),
                kRelativeTolerance)
          << "sequence " << s << " position " << (*runner)->Length(0) - 1;
      ++row;
    }
  }
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<testing::BackendUnderTest, std::string>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param);
}
INSTANTIATE_TEST_SUITE_P(Backends, GoldenParityTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::ListGoldenVariants())),
                         TestName);
INSTANTIATE_TEST_SUITE_P(
    Backends, GoldenDroplessTest,
    ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                       ::testing::ValuesIn(testing::ListGoldenVariants(/*dropless_only=*/true))),
    TestName);

}  // namespace
}  // namespace switchserve
