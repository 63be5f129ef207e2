// The CUDA backend as a whole: decode-graph bookkeeping (bucket choice,
// eligibility, padding rows), sampling of many differently configured
// requests in one step against the host sampler, and (on the SIMT executor)
// bitwise-equal steps whatever the thread order.
#include <cuda_runtime_api.h>

#include <limits>
#include <string>
#include <vector>

#include "engine/moe/router_layout.h"
#include "engine/runtime/sampler.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_step.h"
#include "kernels/cuda/decode_graphs.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/util/backend_harness.h"
#include "tests/util/random_model.h"
#if defined(SWITCHSERVE_SIMT_EMULATION)
#include "kernels/cuda/simt_control.h"
#endif

namespace switchserve {
namespace {

using testing::BackendHarness;
using testing::RandomTokens;
using testing::RandomWeights;

TEST(DecodeGraphsTest, BucketIsTheSmallestPowerOfTwoThatHolds) {
  EXPECT_EQ(cuda::DecodeBucket(1), 1);
  EXPECT_EQ(cuda::DecodeBucket(2), 2);
  EXPECT_EQ(cuda::DecodeBucket(3), 4);
  EXPECT_EQ(cuda::DecodeBucket(5), 8);
  EXPECT_EQ(cuda::DecodeBucket(64), 64);
  EXPECT_EQ(cuda::DecodeBucket(65), 128);
  EXPECT_EQ(cuda::DecodeBucket(256), 256);
  EXPECT_EQ(cuda::DecodeBucket(257), 0);
  EXPECT_EQ(cuda::DecodeBucket(0), 0);
}

TEST(DecodeGraphsTest, OnlyPerSequenceDispatchDecodeStepsThatFitTheBucketRunFromGraphs) {
  const int max_seq_len = 8;  // 2 blocks of 4
  const int64_t kv_blocks = 64;
  const std::vector<int32_t> table = {3, 5};
  StepBatch decode;
  decode.Clear(4);
  decode.Add(std::vector<int32_t>{7}, 5, table);
  decode.Add(std::vector<int32_t>{8}, 2, table);
  DispatchConfig dropless;
  EXPECT_TRUE(cuda::GraphEligible(decode, dropless, max_seq_len, kv_blocks));
  DispatchConfig step_capacity;
  step_capacity.capacity_factor = 1.0;
  step_capacity.scope = CapacityScope::kStep;
  EXPECT_FALSE(cuda::GraphEligible(decode, step_capacity, max_seq_len, kv_blocks));
  DispatchConfig sequence_capacity = step_capacity;
  sequence_capacity.scope = CapacityScope::kSequence;
  EXPECT_TRUE(cuda::GraphEligible(decode, sequence_capacity, max_seq_len, kv_blocks));
  StepBatch prefill = decode;
  prefill.Add(std::vector<int32_t>{1, 2}, 0, table);
  EXPECT_FALSE(cuda::GraphEligible(prefill, dropless, max_seq_len, kv_blocks));
  StepBatch empty;
  empty.Clear(4);
  EXPECT_FALSE(cuda::GraphEligible(empty, dropless, max_seq_len, kv_blocks));
  StepBatch big;
  big.Clear(4);
  for (int s = 0; s <= cuda::kMaxDecodeBucket; ++s) big.Add(std::vector<int32_t>{1}, 0, table);
  EXPECT_FALSE(cuda::GraphEligible(big, dropless, max_seq_len, kv_blocks));
  // A block table longer than a context's worth of blocks.
  StepBatch long_table = decode;
  long_table.Add(std::vector<int32_t>{1}, 0, std::vector<int32_t>{1, 2, 4});
  EXPECT_FALSE(cuda::GraphEligible(long_table, dropless, max_seq_len, kv_blocks));
  // More logprobs than a graph step returns; a history longer than a context.
  SamplingParams many;
  many.logprobs = cuda::kGraphMaxLogprobs + 1;
  SamplerRng rng(1);
  StepBatch logprobs = decode;
  logprobs.sequences[0].sample = {&many, {}, &rng};
  EXPECT_FALSE(cuda::GraphEligible(logprobs, dropless, max_seq_len, kv_blocks));
  SamplingParams few;
  const std::vector<int32_t> history(max_seq_len + 1, 3);
  StepBatch long_history = decode;
  long_history.sequences[0].sample = {&few, history, &rng};
  EXPECT_FALSE(cuda::GraphEligible(long_history, dropless, max_seq_len, kv_blocks));
  long_history.sequences[0].sample.history = absl::MakeConstSpan(history.data(), max_seq_len);
  EXPECT_TRUE(cuda::GraphEligible(long_history, dropless, max_seq_len, kv_blocks));
  // All together, more blocks than the cache has, or more penalized history
  // ids than its blocks hold tokens (the arrays are sized by the cache).
  EXPECT_TRUE(cuda::GraphEligible(decode, dropless, max_seq_len, 4));
  EXPECT_FALSE(cuda::GraphEligible(decode, dropless, max_seq_len, 3));
  SamplingParams penalized;
  penalized.repetition_penalty = 1.2f;
  StepBatch penalties = decode;
  penalties.sequences[0].sample = {&penalized, history, &rng};  // 9 ids
  penalties.sequences[1].sample = {&penalized, absl::MakeConstSpan(history.data(), 7), &rng};
  EXPECT_TRUE(cuda::GraphEligible(penalties, dropless, 9, 4));  // 16 ids, 16 tokens
  penalties.sequences[1].sample.history = absl::MakeConstSpan(history.data(), 8);
  EXPECT_FALSE(cuda::GraphEligible(penalties, dropless, 9, 4));
}

TEST(DecodeGraphsTest, PaddingRowsWriteTheScratchBlockAndReturnNothing) {
  const std::vector<int32_t> table = {3, 5};
  StepBatch decode;
  decode.Clear(4);
  decode.Add(std::vector<int32_t>{7}, 5, table).logits = LogitsMode::kLast;
  decode.Add(std::vector<int32_t>{8}, 2, table).collect_routing = true;
  decode.Add(std::vector<int32_t>{9}, 6, table);
  StepBatch padded;
  cuda::PadDecodeStep(decode, cuda::DecodeBucket(3), /*scratch_block=*/64, &padded);
  ASSERT_EQ(padded.num_sequences(), 4);
  ASSERT_EQ(padded.num_tokens(), 4);
  for (int s = 0; s < 3; ++s) {  // the real ones unchanged
    EXPECT_EQ(padded.token_ids[s], decode.token_ids[s]);
    EXPECT_EQ(padded.positions[s], decode.positions[s]);
    EXPECT_EQ(padded.cache_rows[s], decode.cache_rows[s]);
    EXPECT_EQ(padded.sequences[s].logits, decode.sequences[s].logits);
  }
  EXPECT_EQ(padded.positions[3], 0);
  EXPECT_EQ(padded.cache_rows[3], 64 * 4);  // the scratch block's first row
  EXPECT_EQ(padded.num_blocks(3), 1);
  EXPECT_EQ(padded.block_table(3)[0], 64);
  EXPECT_EQ(padded.sequences[3].logits, LogitsMode::kNone);
  EXPECT_FALSE(padded.sequences[3].collect_routing);
  EXPECT_EQ(padded.sequences[3].sample.params, nullptr);
}

// A decode graph's block tables and histories are laid out for what the KV
// cache can hold, and only their used parts are copied: sized by bucket x
// max_seq_len they were 16 x 4 MiB of int32 at a context of 2^20, zeroed
// and copied every step.
TEST(DecodeGraphsTest, GraphStepsCopyWhatTheirSequencesUse) {
  ModelConfig config = testing::TinySwitchAllConfig();
  config.max_seq_len = 1 << 20;
  const RouterLayout layout(config);
  cuda::StepModel model;
  model.vocab = config.vocab_size;
  model.max_seq_len = config.max_seq_len;
  model.block_size = 16;
  model.kv_blocks = 64;
  model.layout = &layout;
  cuda::StepIo io(model);
  SamplingParams penalized;
  penalized.repetition_penalty = 1.5f;
  const std::vector<int32_t> history(40, 3);  // a prompt and its tokens so far
  std::vector<SamplerRng> rngs(9, SamplerRng(5));
  StepBatch decode;
  decode.Clear(model.block_size);
  for (int s = 0; s < 9; ++s) {
    const std::vector<int32_t> table = {3 * s, 3 * s + 1, 3 * s + 2};
    StepSequence& sequence = decode.Add(std::vector<int32_t>{7}, 40, table);
    sequence.logits = LogitsMode::kLast;
    sequence.sample = {&penalized, history, &rngs[s]};
  }
  const int bucket = cuda::DecodeBucket(9);
  StepBatch padded;
  cuda::PadDecodeStep(decode, bucket, /*scratch_block=*/64, &padded);
  ASSERT_TRUE(io.Prepare(padded, 9, bucket, nullptr).ok());
  // The cache's rows, not 16 x 2^20, and room for each sequence's logit bias
  // and allowed ids.
  const int64_t bias_room = 16 * (2 * kMaxSampleBiases + cuda::kGraphMaxAllowedTokenIds);
  EXPECT_EQ(io.shape().history, 64 * 16 + bias_room);
  EXPECT_EQ(io.shape().block_entries, 64 + 16);
  EXPECT_LT(io.input_bytes(), (size_t{32} << 10) + bias_room * 4);
  // The fixed arrays and 9 x 3 + 7 table entries, then 9 x 40 history tokens.
  EXPECT_LT(io.upload_bytes(), io.input_bytes() - (io.shape().history - 9 * 40) * 4);
  EXPECT_GE(io.upload_bytes(), size_t{(9 * 3 + 7) * 4 + 9 * 40 * 4});
}

// A config may give a context of 2^31 - 1 positions: the position tables
// cover the KV cache's rows, which bound every position. Sized by the
// context, the RoPE table's int size overflowed to one element and its
// loop wrote past it. The logits are those of the same model at 128.
TEST(CudaBackendTest, PositionTablesCoverTheCachesRowsWhateverTheContext) {
  const ModelConfig small = testing::TinySwitchAllConfig();
  ModelConfig huge = small;
  huge.max_seq_len = std::numeric_limits<int32_t>::max();
  const ModelWeights weights = RandomWeights(small, 311);
  const std::vector<int32_t> tokens = RandomTokens(9, small.vocab_size, 312);
  BackendHarness at_128(testing::CudaBackendWith(testing::Cuda16BitOptions(), "cuda"), small,
                        weights, small.dispatch);
  BackendHarness at_max(testing::CudaBackendWith(testing::Cuda16BitOptions(), "cuda"), huge,
                        weights, huge.dispatch);
  const std::vector<float> want = at_128.Run(1, tokens, 0);
  const std::vector<float> got = at_max.Run(1, tokens, 0);
  EXPECT_EQ(testing::FloatBytes(got, 0, got.size()), testing::FloatBytes(want, 0, want.size()));
}

// Sixteen requests, each with its own mix of sampling parameters (penalties,
// logit biases, min_tokens, bad_words and allowed_token_ids among them), in
// one prefill step and then a decode step (a graph bucket): every token is the
// host sampler's choice from the returned logits, and each generator advanced
// by the same draws.
TEST(CudaBackendTest, EveryRequestSamplesLikeTheHostSampler) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = RandomWeights(config, 301);
  const int V = config.vocab_size, n = 16;
  std::vector<SamplingParams> params(n);
  for (int i = 0; i < n; ++i) {
    SamplingParams& p = params[i];
    p.temperature = i % 4 == 0 ? 0.0f : 0.5f + 0.1f * static_cast<float>(i);
    p.top_k = i % 3 == 0 ? 0 : (i % 3 == 1 ? 5 : V + 1);
    p.top_p = i % 5 == 0 ? 0.7f : 1.0f;
    p.min_p = i % 7 == 0 ? 0.05f : 0.0f;
    p.repetition_penalty = i % 2 == 0 ? 1.0f : 1.5f;
    p.presence_penalty = i % 3 == 2 ? 0.8f : 0.0f;
    p.frequency_penalty = i % 4 == 1 ? -0.6f : 0.0f;
    if (i % 5 == 3) p.logit_bias = {{1, 30.0f}, {V - 1, -3.0f}};  // decides the token
    if (i % 6 == 2) {
      // min_tokens holds back 1, which its bias would choose, and 4.
      p.logit_bias = {{1, 30.0f}};
      p.min_tokens = 8;
      p.min_tokens_ids = {1, 4};
    }
    if (i % 6 == 5) {
      // Held back at i = 5 (1 token generated), not at i = 11 (2).
      p.min_tokens = 2;
      p.min_tokens_ids = {0, 2, V - 1};
    }
    p.logprobs = i % 4;
    p.sampled_logprob = i % 8 == 0;  // "logprobs": 0; the others at 0 get no logprob
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(RandomTokens(2 + i % 5, V, 310 + i));
  for (int i = 0; i < n; ++i) {
    // Only a few ids allowed (the most likely may not be), a bias among them.
    if (i % 7 == 4) params[i].allowed_token_ids = {2, 3, V - 2};
    // bad_words: one id always, and every even id after the last generated.
    if (i % 4 == 2) {
      params[i].bad_words_ids = {{3}};
      for (int32_t id = 0; id < V; id += 2)
        params[i].bad_words_ids.push_back({prompts[i].back(), id});
    }
  }
  std::vector<SamplerRng> rngs, expected;
  for (int i = 0; i < n; ++i) {
    rngs.emplace_back(900 + i);
    expected.emplace_back(900 + i);
  }
  BackendHarness h(testing::CudaBackendWith(testing::Cuda16BitOptions(), "cuda"), config, weights,
                   config.dispatch);
  for (int step = 0; step < 2; ++step) {
    std::vector<BackendHarness::Chunk> chunks;
    for (int i = 0; i < n; ++i) {
      const int length = static_cast<int>(prompts[i].size());
      BackendHarness::Chunk chunk = step == 0 ? BackendHarness::Chunk{i, prompts[i], 0}
                                              : BackendHarness::Chunk{i, {prompts[i][0]}, length};
      chunk.logits = LogitsMode::kLast;
      // The history's first id taken as the prompt, the rest as generated
      // (the presence and frequency penalties count those).
      chunk.sample = {&params[i], prompts[i], &rngs[i], /*prompt_length=*/1};
      chunks.push_back(chunk);
    }
    StepOutput out;
    ASSERT_TRUE(h.Step(chunks, &out).ok());
    ASSERT_EQ(out.samples.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("step " + std::to_string(step) + " request " + std::to_string(i));
      const std::vector<float> logits = testing::Slice(out.logits, i, V);
      const SampleResult want =
          SampleToken(logits, params[i], prompts[i], 1, params[i].logprobs, expected[i]);
      EXPECT_EQ(out.samples[i].sequence, i);
      EXPECT_EQ(out.samples[i].sample.token_id, want.token_id);
      EXPECT_EQ(out.samples[i].sample.logprob, want.logprob);
      ASSERT_EQ(out.samples[i].sample.top_logprobs.size(), want.top_logprobs.size());
      for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
        EXPECT_EQ(out.samples[i].sample.top_logprobs[j].first, want.top_logprobs[j].first);
        EXPECT_EQ(out.samples[i].sample.top_logprobs[j].second, want.top_logprobs[j].second);
      }
    }
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(rngs[i].Next(), expected[i].Next()) << "request " << i;
}

// A step of three tokens of sequence 0 (block table {0}) at `block_size`.
absl::Status ThreeTokenStep(Backend& backend, int block_size, int vocab) {
  StepBatch batch;
  batch.Clear(block_size);
  batch.Add(RandomTokens(3, vocab, 307), 0, std::vector<int32_t>{0});
  StepOutput out;
  return backend.Forward(batch, &out);
}

// Attention stages a whole KV block in shared memory, 4 * (B * dh * (1 + ev)
// + group * (2 dh + B + 3) + ev) bytes for a block of B tokens: the largest
// block size the device's opt-in limit holds runs; one token more is refused
// when the cache is made, naming the flag, the bytes and the largest size.
TEST(CudaBackendTest, KvBlocksPastTheDevicesSharedMemoryAreRefused) {
  ModelConfig config = testing::SwitchHeadDestinationConfig();  // group 2, ev = E = 4
  config.n_layers = 1;
  const ModelWeights weights = RandomWeights(config, 305);
  auto backend = CreateCudaBackend(config, weights, config.dispatch, testing::Cuda16BitOptions());
  ASSERT_TRUE(backend.ok()) << backend.status();
  int limit = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  const AttentionConfig& attn = config.attention;
  const int64_t dh = attn.head_dim, ev = attn.CachedValuesPerKvHead();
  const int64_t group = attn.n_heads / attn.n_kv_heads;
  const auto bytes = [&](int64_t block) {
    return 4 * (block * dh * (1 + ev) + group * (2 * dh + block + 3) + ev);
  };
  const int largest =
      static_cast<int>((limit / 4 - group * (2 * dh + 3) - ev) / (dh * (1 + ev) + group));
  ASSERT_LE(bytes(largest), limit);
  ASSERT_GT(bytes(largest + 1), limit);

  const absl::Status refused = (*backend)->InitKvCache(2, largest + 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  const std::string message(refused.message());
  for (const std::string& part :
       {"--kv-block-size " + std::to_string(largest + 1), std::to_string(bytes(largest + 1)),
        std::to_string(limit),
        "largest block size that fits this model is " + std::to_string(largest)}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  ASSERT_TRUE((*backend)->InitKvCache(2, largest).ok());
  EXPECT_TRUE(ThreeTokenStep(**backend, largest, config.vocab_size).ok());
}

// Router top-k and capacity dispatch hold a router's experts in one block's
// shared memory (dispatch_plan.h: 4 * (15 E + 1) bytes, more than top-k's):
// a router with the most experts the device's opt-in limit holds runs a step
// (past 48 KiB, which needs the opt-in); one expert more is refused when the
// backend is made, naming both counts.
TEST(CudaBackendTest, RoutersWithMoreExpertsThanTheDeviceHoldsAreRefused) {
  int limit = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  const int most = (limit / 4 - 1) / 15;
  ModelConfig config = testing::TinySwitchAllConfig();
  config.n_layers = 1;
  config.ffn.d_ff = 4;
  for (const int experts : {most, most + 1}) {
    SCOPED_TRACE(std::to_string(experts) + " FFN experts");
    config.ffn.n_experts = experts;
    const ModelWeights weights = RandomWeights(config, 306);
    auto backend = CreateCudaBackend(config, weights, config.dispatch, testing::Cuda16BitOptions());
    if (experts == most) {
      ASSERT_TRUE(backend.ok()) << backend.status();
      ASSERT_TRUE((*backend)->InitKvCache(2, 4).ok());
      EXPECT_TRUE(ThreeTokenStep(**backend, 4, config.vocab_size).ok());
      continue;
    }
    ASSERT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << backend.status();
    const std::string message(backend.status().message());
    for (const std::string& part : {"at most " + std::to_string(most) + " experts",
                                    "ffn router has " + std::to_string(experts) + " experts"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
  }
}

// Attention's expert products launch one matrix per head and expert on the
// grid's z (at most 65,535): 32 heads of 2,048 experts failed at the first
// step; they are refused when the backend is created.
TEST(CudaBackendTest, AttentionExpertsPastTheGridsZAreRefused) {
  ModelConfig config = testing::TinySwitchAllConfig();
  config.n_layers = 1;
  config.d_model = 8;
  config.attention.n_heads = 32;
  config.attention.n_kv_heads = 32;
  config.attention.head_dim = 4;
  config.attention.n_experts = 2048;
  const ModelWeights weights = RandomWeights(config, 307);
  auto backend = CreateCudaBackend(config, weights, config.dispatch, testing::Cuda16BitOptions());
  ASSERT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument) << backend.status();
  EXPECT_NE(backend.status().message().find("the model has 32 x 2048"), std::string::npos)
      << backend.status();
}

#if defined(SWITCHSERVE_SIMT_EMULATION)
// A mixed step (prefill chunks, decodes, sampling, routing, capacity
// reroute) run once per thread order of the executor: the same bytes.
TEST(CudaBackendTest, StepsAreBitwiseEqualInEveryThreadOrder) {
  const ModelConfig config = testing::SwitchHeadGqaConfig();
  const ModelWeights weights = RandomWeights(config, 302);
  const int V = config.vocab_size;
  DispatchConfig dispatch;
  dispatch.capacity_factor = 0.75;
  dispatch.overflow = OverflowPolicy::kReroute;
  SamplingParams hot;
  hot.temperature = 0.9f;
  hot.top_k = 10;
  hot.logprobs = 3;
  std::vector<std::string> runs;
  for (const char* order : {"forward", "reverse", "random:5", "random:6"}) {
    simt::ThreadOrder parsed;
    ASSERT_TRUE(simt::ParseThreadOrder(order, &parsed));
    simt::SetThreadOrder(parsed);
    BackendHarness h(testing::CudaBackendWith(testing::Cuda16BitOptions(), "cuda"), config, weights,
                     dispatch);
    SamplerRng rng(77);
    const std::vector<int32_t> a = RandomTokens(11, V, 303), b = RandomTokens(5, V, 304);
    StepOutput first, second;
    ASSERT_TRUE(
        h.Step({{1, a, 0, LogitsMode::kAll, true}, {2, b, 0, LogitsMode::kLast}}, &first).ok());
    ASSERT_TRUE(h.Step({{2, {b[0]}, 5, LogitsMode::kNone, true, {&hot, b, &rng}},
                        {1, {a[0], a[1]}, 11, LogitsMode::kAll}},
                       &second)
                    .ok());
    runs.push_back(testing::OutputBytes(first) + testing::OutputBytes(second));
  }
  simt::SetThreadOrder(simt::ThreadOrder{});
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_TRUE(runs[i] == runs[0]) << "order " << i;
}
#endif

}  // namespace
}  // namespace switchserve
