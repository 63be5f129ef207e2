// Every backend (BackendsUnderTest()) against the Python reference's golden
// vectors (tools/reference/make_goldens.py, computed in float64).
//
// Tolerances: logits, gate values and probability sums within a relative
// error of 1e-4 (max |ours - golden| / max |golden|, f32 arithmetic against a
// float64 reference); routing decisions, capacity counts and the routing trace
// exactly (the goldens are generated with every routing margin > 1e-3, so f32
// rounding cannot flip a decision).
#include <algorithm>
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
  for (const char* required : {"switchhead_sigmoid",
                               "switchhead_e1",
                               "switchhead_softmax_topk",
                               "switchhead_shared_router",
                               "switchhead_gqa",
                               "switchhead_dest_values",
                               "dense_mha",
                               "dense_gqa",
                               "switch_ffn_top1_drop",
                               "switch_ffn_top2_drop",
                               "switch_ffn_top1_reroute",
                               "switch_ffn_top2_reroute",
                               "switch_ffn_dropless_renorm",
                               "sigma_moe",
                               "switchall_capacity",
                               "switchall_bf16",
                               "switchall_f16",
                               "seq_ffn_top2_drop_g4",
                               "seq_ffn_top1_reroute_g10",
                               "seq_switchall_drop_g8",
                               "seq_switchall_reroute_g16",
                               "seq_switchall_chunked_g5",
                               "seq_default_scope"}) {
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

  // Every logit, statistic and routing decision of the step (or of the
  // steps, with `stats` summed over them) against the golden's.
  void ExpectMatchesGolden(const std::vector<float>& logits,
                           const std::vector<TokenRouting>& routing,
                           const StepRoutingStats& stats) const {
    const int vocab = model_->config.vocab_size;
    ASSERT_EQ(logits.size(), golden_.logits.size());
    EXPECT_LE(RelativeError(logits.data(), golden_.logits.data(), golden_.logits.size()),
              kRelativeTolerance);
    ASSERT_EQ(stats.routers.size(), golden_.routers.size());
    const size_t total_tokens = golden_.logits.size() / vocab;
    ASSERT_EQ(routing.size(), total_tokens);
    size_t choice_offset = 0;
    for (size_t r = 0; r < golden_.routers.size(); ++r) {
      const testing::GoldenRouter& want = golden_.routers[r];
      const RouterStepStats& got = stats.routers[r];
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
        ASSERT_GE(routing[t].choices.size(), choice_offset + k) << "token " << t;
        for (int i = 0; i < k; ++i) {
          const RouteChoice& choice = routing[t].choices[choice_offset + i];
          EXPECT_EQ(choice.expert, want.expert[t * k + i]) << "token " << t << " rank " << i;
          EXPECT_EQ(static_cast<int>(choice.fate), want.fate[t * k + i]) << "token " << t;
          EXPECT_NEAR(choice.gate, want.gate[t * k + i], kRelativeTolerance) << "token " << t;
        }
      }
      choice_offset += k;
    }
  }

  GoldenCase golden_;
  std::unique_ptr<Model> model_;
};

// All sequences in one engine step, as the reference ran them.
TEST_P(GoldenParityTest, OneStepMatchesReference) {
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
  ExpectMatchesGolden(output.logits, output.routing, output.stats);
}

// Variants whose results cannot depend on the batching (dropless, or the
// sequence capacity scope).
using GoldenBatchIndependentTest = GoldenParityTest;

// Decoding each sequence alone, one token at a time through the paged cache
// (carrying its capacity group loads), reproduces the reference's batched
// logits.
TEST_P(GoldenBatchIndependentTest, DecodeAloneMatchesReference) {
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

// The sequences run chunk by chunk over several steps, each sequence carrying
// its capacity group loads: the variant's own chunk schedule (`steps`) when
// it has one, else uneven chunks of 1 to 4 tokens. Every logit and routing
// decision equals the one-step golden's, and the steps' statistics add up to
// its statistics.
TEST_P(GoldenBatchIndependentTest, ChunkScheduleMatchesReference) {
  const int vocab = model_->config.vocab_size;
  const size_t B = golden_.sequences.size();
  std::vector<std::vector<int32_t>> schedule = golden_.steps;
  if (schedule.empty()) {
    std::vector<int32_t> left(B);
    for (size_t b = 0; b < B; ++b) left[b] = static_cast<int32_t>(golden_.sequences[b].size());
    for (int s = 0; std::any_of(left.begin(), left.end(), [](int32_t n) { return n > 0; }); ++s) {
      std::vector<int32_t>& step = schedule.emplace_back(B, 0);
      for (size_t b = 0; b < B; ++b) {
        step[b] = std::min(left[b], 1 + static_cast<int32_t>((s + b) % 4));
        left[b] -= step[b];
      }
    }
  }
  std::unique_ptr<Backend> backend = NewBackend();
  KvCacheOptions options;
  options.block_size = 4;  // chunks cross blocks
  options.max_tokens = 64 * 16;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend.get(), options);
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  KvBlockAllocator& allocator = (*kv_cache)->allocator();

  std::vector<size_t> first_row(B, 0);  // golden row of each sequence's position 0
  for (size_t b = 1; b < B; ++b) first_row[b] = first_row[b - 1] + golden_.sequences[b - 1].size();
  const size_t total_tokens = golden_.logits.size() / vocab;
  std::vector<float> logits(golden_.logits.size(), 0.0f);
  std::vector<TokenRouting> routing(total_tokens);
  std::vector<GroupLoads> group_loads(B);
  std::vector<int32_t> done(B, 0);
  StepRoutingStats stats;
  for (const std::vector<int32_t>& step : schedule) {
    ASSERT_EQ(step.size(), B);
    StepBatch batch;
    batch.Clear(allocator.block_size());
    std::vector<size_t> batch_sequence;  // golden sequence of each batch entry
    for (size_t b = 0; b < B; ++b) {
      if (step[b] == 0) continue;
      ASSERT_TRUE(allocator.Reserve(b, done[b] + step[b]).ok());
      StepSequence& sequence =
          batch.Add(absl::MakeConstSpan(golden_.sequences[b]).subspan(done[b], step[b]), done[b],
                    allocator.BlockTable(b));
      sequence.logits = LogitsMode::kAll;
      sequence.collect_routing = true;
      sequence.group_loads = &group_loads[b];
      batch_sequence.push_back(b);
    }
    StepOutput output;
    ASSERT_TRUE(backend->Forward(batch, &output).ok());
    for (size_t r = 0; r < output.row_sequence.size(); ++r) {
      const size_t b = batch_sequence[output.row_sequence[r]];
      const size_t row = first_row[b] + output.row_position[r];
      std::copy_n(output.logits.begin() + r * vocab, vocab, logits.begin() + row * vocab);
      routing[row] = output.routing[r];
    }
    if (stats.routers.empty()) {
      stats = output.stats;
    } else {
      stats.Add(output.stats);
    }
    for (size_t b = 0; b < B; ++b) done[b] += step[b];
  }
  for (size_t b = 0; b < B; ++b) {
    ASSERT_EQ(static_cast<size_t>(done[b]), golden_.sequences[b].size())
        << "schedule, sequence " << b;
  }
  ExpectMatchesGolden(logits, routing, stats);
}

std::string TestName(
    const ::testing::TestParamInfo<std::tuple<testing::BackendUnderTest, std::string>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param);
}
INSTANTIATE_TEST_SUITE_P(Backends, GoldenParityTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::ListGoldenVariants())),
                         TestName);
INSTANTIATE_TEST_SUITE_P(Backends, GoldenBatchIndependentTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::ListGoldenVariants(
                                                /*batch_independent_only=*/true))),
                         TestName);

}  // namespace
}  // namespace switchserve
