#include "tests/util/backend_harness.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace switchserve::testing {

std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& v : t) v = static_cast<int32_t>(rng() % vocab);
  return t;
}

double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<float> Slice(const std::vector<float>& v, size_t row, size_t width) {
  return std::vector<float>(v.begin() + row * width, v.begin() + (row + 1) * width);
}

BackendHarness::BackendHarness(const BackendUnderTest& backend, const ModelConfig& config,
                               const ModelWeights& weights, const DispatchConfig& dispatch,
                               bool prefix_caching)
    : backend_(backend.create(config, weights, dispatch)) {
  KvCacheOptions cache;
  cache.prefix_caching = prefix_caching;
  cache.block_size = kHarnessBlockSize;
  cache.max_tokens = kHarnessNumBlocks * kHarnessBlockSize;
  auto kv_cache = KvCache::Create(backend_.get(), cache);
  EXPECT_TRUE(kv_cache.ok()) << kv_cache.status();
  kv_cache_ = *std::move(kv_cache);
  EXPECT_TRUE(alloc().Reserve(-1, 3 * kHarnessBlockSize).ok());
}

absl::Status BackendHarness::Step(const std::vector<Chunk>& chunks, StepOutput* out) {
  for (const Chunk& c : chunks) {
    EXPECT_TRUE(alloc().Reserve(c.seq, c.start + static_cast<int64_t>(c.tokens.size())).ok());
  }
  StepBatch batch;
  batch.Clear(alloc().block_size());
  for (const Chunk& c : chunks) {
    StepSequence& sequence = batch.Add(c.tokens, c.start, alloc().BlockTable(c.seq));
    sequence.logits = c.logits;
    sequence.collect_routing = c.collect;
    sequence.sample = c.sample;
    sequence.group_loads = &group_loads_[c.seq];
  }
  return backend_->Forward(batch, out);
}

std::vector<float> BackendHarness::Run(SequenceId seq, const std::vector<int32_t>& tokens,
                                       int start) {
  StepOutput out;
  const absl::Status status = Step({{seq, tokens, start}}, &out);
  EXPECT_TRUE(status.ok()) << status;
  return out.logits;
}

}  // namespace switchserve::testing
