// Every backend (BackendsUnderTest()) against the Python reference's golden
// vectors (tools/reference/make_goldens.py, computed in float64): all
// sequences in one step, the variant's chunk schedule replayed step by step,
// and, where the results cannot depend on the batching (dropless, or the
// sequence capacity scope), each sequence decoded alone and every sequence run
// in uneven chunks.
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
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"
#include "engine/moe/router_layout.h"
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
                               "xl_switchhead",
                               "xl_switchhead_e1",
                               "xl_switchall_sigma",
                               "xl_dense_gqa",
                               "xl_shared_dest",
                               "xl_long",
                               "seq_ffn_top2_drop_g4",
                               "seq_ffn_top1_reroute_g10",
                               "seq_switchall_drop_g8",
                               "seq_switchall_reroute_g16",
                               "seq_switchall_chunked_g5",
                               "seq_default_scope",
                               "switchall_wide"}) {
    EXPECT_NE(std::find(variants.begin(), variants.end(), required), variants.end())
        << "missing golden variant " << required;
  }
  // Every XL variant comes with a chunk schedule.
  const std::vector<std::string> scheduled = testing::ListScheduledGoldenVariants();
  for (const char* required :
       {"xl_switchhead", "xl_switchhead_e1", "xl_switchall_sigma", "xl_dense_gqa", "xl_shared_dest",
        "xl_long", "seq_switchall_chunked_g5"}) {
    EXPECT_NE(std::find(scheduled.begin(), scheduled.end(), required), scheduled.end())
        << "no chunk schedule in golden variant " << required;
  }
}

// Per router: the counts exactly, probability sums and aux loss to the
// tolerance; per token (step order) and rank: expert and fate exactly, the
// gate to the tolerance.
void ExpectRoutingMatches(const GoldenCase& golden, const StepRoutingStats& stats,
                          const std::vector<TokenRouting>& routing) {
  ASSERT_EQ(stats.routers.size(), golden.routers.size());
  size_t choice_offset = 0;
  for (size_t r = 0; r < golden.routers.size(); ++r) {
    const testing::GoldenRouter& want = golden.routers[r];
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
    for (size_t t = 0; t < routing.size(); ++t) {
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

// A paged KV cache on `backend`: `blocks` blocks of `block_size` tokens.
absl::StatusOr<std::unique_ptr<KvCache>> NewCache(Backend* backend, int block_size, int blocks) {
  KvCacheOptions options;
  options.block_size = block_size;
  options.max_tokens = static_cast<int64_t>(blocks) * block_size;
  return KvCache::Create(backend, options);
}

// `tokens`, positions `start` on of sequence `id`, into `batch` with their
// cache blocks reserved, every logit and routing decision collected, and the
// sequence's capacity group loads carried (`group_loads`, or none if null).
absl::Status AddChunk(KvBlockAllocator& allocator, SequenceId id, absl::Span<const int32_t> tokens,
                      int32_t start, GroupLoads* group_loads, StepBatch& batch) {
  if (absl::Status s = allocator.Reserve(id, start + tokens.size()); !s.ok()) return s;
  StepSequence& sequence = batch.Add(tokens, start, allocator.BlockTable(id));
  sequence.logits = LogitsMode::kAll;
  sequence.collect_routing = true;
  sequence.group_loads = group_loads;
  return absl::OkStatus();
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

  // The golden row (step order) of each sequence's first token.
  std::vector<size_t> FirstRows() const {
    std::vector<size_t> first_row(golden_.sequences.size(), 0);
    for (size_t b = 1; b < first_row.size(); ++b) {
      first_row[b] = first_row[b - 1] + golden_.sequences[b - 1].size();
    }
    return first_row;
  }

  // Logits and routing gathered from several steps into golden rows, and the
  // steps' statistics summed, checked against the one-step golden.
  struct Gathered {
    std::vector<float> logits;
    std::vector<TokenRouting> routing;
    StepRoutingStats stats;
  };
  Gathered EmptyGathered() const {
    Gathered gathered;
    gathered.logits.assign(golden_.logits.size(), NAN);
    gathered.routing.resize(golden_.logits.size() / model_->config.vocab_size);
    gathered.stats.Reset(RouterLayout(model_->config).routers());
    return gathered;
  }
  void ExpectGatheredMatches(const Gathered& gathered) const {
    EXPECT_LE(RelativeError(gathered.logits.data(), golden_.logits.data(), gathered.logits.size()),
              kRelativeTolerance);
    ExpectRoutingMatches(golden_, gathered.stats, gathered.routing);
  }

  GoldenCase golden_;
  std::unique_ptr<Model> model_;
};

// All sequences in one engine step, as the reference ran them.
TEST_P(GoldenParityTest, OneStepMatchesReference) {
  const int vocab = model_->config.vocab_size;
  std::unique_ptr<Backend> backend = NewBackend();
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = NewCache(backend.get(), 16, 64);
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  KvBlockAllocator& allocator = (*kv_cache)->allocator();
  StepBatch batch;
  batch.Clear(allocator.block_size());
  for (size_t s = 0; s < golden_.sequences.size(); ++s) {
    ASSERT_TRUE(AddChunk(allocator, s, golden_.sequences[s], 0, nullptr, batch).ok());
  }
  StepOutput output;
  ASSERT_TRUE(backend->Forward(batch, &output).ok());
  ASSERT_EQ(output.logits.size(), golden_.logits.size());
  EXPECT_LE(RelativeError(output.logits.data(), golden_.logits.data(), golden_.logits.size()),
            kRelativeTolerance);
  ASSERT_EQ(output.routing.size(), golden_.logits.size() / vocab);
  ExpectRoutingMatches(golden_, output.stats, output.routing);
}

// The variant's chunk schedule (golden `steps`) replayed step by step through
// the paged cache, each step holding the chunks the schedule gives it and each
// sequence carrying its capacity group loads: every token's logits and
// routing are the reference's, and the steps' statistics add up to the
// reference's.
using GoldenScheduleTest = GoldenParityTest;

TEST_P(GoldenScheduleTest, ReplayedScheduleMatchesReference) {
  ASSERT_FALSE(golden_.steps.empty());
  const int vocab = model_->config.vocab_size;
  const size_t num_sequences = golden_.sequences.size();
  std::unique_ptr<Backend> backend = NewBackend();
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = NewCache(backend.get(), 16, 64);
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  KvBlockAllocator& allocator = (*kv_cache)->allocator();

  const std::vector<size_t> first_row = FirstRows();
  Gathered gathered = EmptyGathered();
  std::vector<int32_t> done(num_sequences, 0);
  std::vector<GroupLoads> group_loads(num_sequences);
  for (size_t s = 0; s < golden_.steps.size(); ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    ASSERT_EQ(golden_.steps[s].size(), num_sequences);
    StepBatch batch;
    batch.Clear(allocator.block_size());
    std::vector<size_t> members;
    for (size_t b = 0; b < num_sequences; ++b) {
      const int32_t n = golden_.steps[s][b];
      if (n == 0) continue;
      const std::vector<int32_t>& tokens = golden_.sequences[b];
      ASSERT_LE(done[b] + n, static_cast<int32_t>(tokens.size()));
      ASSERT_TRUE(AddChunk(allocator, b, absl::MakeConstSpan(tokens).subspan(done[b], n), done[b],
                           &group_loads[b], batch)
                      .ok());
      members.push_back(b);
    }
    StepOutput output;
    ASSERT_TRUE(backend->Forward(batch, &output).ok());
    size_t row = 0;
    for (size_t b : members) {
      for (int32_t i = 0; i < golden_.steps[s][b]; ++i, ++row) {
        const size_t token = first_row[b] + done[b] + i;
        ASSERT_LT(row, output.routing.size());
        ASSERT_EQ(output.row_position[row], done[b] + i);
        std::copy(output.logits.begin() + row * vocab, output.logits.begin() + (row + 1) * vocab,
                  gathered.logits.begin() + token * vocab);
        gathered.routing[token] = output.routing[row];
      }
      done[b] += golden_.steps[s][b];
    }
    ASSERT_EQ(row, output.routing.size());
    gathered.stats.Add(output.stats);
  }
  for (size_t b = 0; b < num_sequences; ++b) {
    ASSERT_EQ(done[b], static_cast<int32_t>(golden_.sequences[b].size())) << "sequence " << b;
  }
  ExpectGatheredMatches(gathered);
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

// Every sequence in uneven chunks of 1 to 4 tokens, side by side in shared
// steps, through a cache of 4-token blocks, each sequence carrying its
// capacity group loads: every logit and routing decision equals the one-step
// golden's, and the steps' statistics add up to its statistics.
TEST_P(GoldenBatchIndependentTest, UnevenChunksMatchReference) {
  const int vocab = model_->config.vocab_size;
  const size_t B = golden_.sequences.size();
  std::unique_ptr<Backend> backend = NewBackend();
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = NewCache(backend.get(), 4, 1024);
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  KvBlockAllocator& allocator = (*kv_cache)->allocator();

  const std::vector<size_t> first_row = FirstRows();
  Gathered gathered = EmptyGathered();
  std::vector<GroupLoads> group_loads(B);
  std::vector<int32_t> done(B, 0);
  for (int step = 0;; ++step) {
    StepBatch batch;
    batch.Clear(allocator.block_size());
    std::vector<size_t> members;  // golden sequence of each batch entry
    for (size_t b = 0; b < B; ++b) {
      const int32_t left = static_cast<int32_t>(golden_.sequences[b].size()) - done[b];
      const int32_t n = std::min(left, 1 + static_cast<int32_t>((step + b) % 4));
      if (n == 0) continue;
      ASSERT_TRUE(AddChunk(allocator, b,
                           absl::MakeConstSpan(golden_.sequences[b]).subspan(done[b], n), done[b],
                           &group_loads[b], batch)
                      .ok());
      members.push_back(b);
    }
    if (members.empty()) break;
    StepOutput output;
    ASSERT_TRUE(backend->Forward(batch, &output).ok());
    for (size_t r = 0; r < output.row_sequence.size(); ++r) {
      const size_t b = members[output.row_sequence[r]];
      const size_t row = first_row[b] + output.row_position[r];
      std::copy_n(output.logits.begin() + r * vocab, vocab, gathered.logits.begin() + row * vocab);
      gathered.routing[row] = output.routing[r];
    }
    gathered.stats.Add(output.stats);
    for (size_t m = 0; m < members.size(); ++m) done[members[m]] += batch.num_tokens(m);
  }
  ExpectGatheredMatches(gathered);
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
    Backends, GoldenScheduleTest,
    ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                       ::testing::ValuesIn(testing::ListScheduledGoldenVariants())),
    TestName);
INSTANTIATE_TEST_SUITE_P(Backends, GoldenBatchIndependentTest,
                         ::testing::Combine(::testing::ValuesIn(testing::BackendsUnderTest()),
                                            ::testing::ValuesIn(testing::ListGoldenVariants(
                                                testing::GoldenFilter::kBatchIndependent))),
                         TestName);

}  // namespace
}  // namespace switchserve
