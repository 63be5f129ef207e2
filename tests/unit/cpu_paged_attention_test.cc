// PagedAttention (kernels/cpu/paged_attention.h) over a cache whose arrays sit
// between inaccessible pages: decode tiles read their KV blocks in order
// before their heads do (TouchInOrder), and no read may leave the rows of
// the sequences' blocks.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/runtime/step_batch.h"
#include "kernels/cpu/cpu_xl_positions.h"
#include "kernels/cpu/kernel_isa.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {
namespace {

// `bytes` (a whole number of pages) with an inaccessible page right before
// and right after them: a read past either end faults.
class GuardedArray {
 public:
  explicit GuardedArray(size_t bytes) : bytes_(bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(bytes % page, 0u);
    void* map = mmap(nullptr, bytes + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(map, MAP_FAILED);
    map_ = static_cast<char*>(map);
    EXPECT_EQ(mprotect(map_ + page, bytes, PROT_READ | PROT_WRITE), 0);
    data_ = reinterpret_cast<float*>(map_ + page);
  }
  ~GuardedArray() { munmap(map_, bytes_ + 2 * static_cast<size_t>(sysconf(_SC_PAGESIZE))); }
  GuardedArray(const GuardedArray&) = delete;
  GuardedArray& operator=(const GuardedArray&) = delete;
  float* data() const { return data_; }

 private:
  size_t bytes_;
  char* map_ = nullptr;
  float* data_ = nullptr;
};

// Dense attention, 4 query heads over 2 KV heads of 16 channels.
AttentionConfig FourHeadsOverTwo() {
  AttentionConfig config;
  config.kind = AttentionKind::kDense;
  config.n_heads = 4;
  config.n_kv_heads = 2;
  config.head_dim = 16;
  return config;
}

// An f32 KV cache of `rows` rows for `config`, keys and values uniform in
// [-1, 1), each array between inaccessible pages.
class RandomGuardedCache {
 public:
  RandomGuardedCache(const AttentionConfig& config, int rows, std::mt19937& rng)
      : bytes_(static_cast<size_t>(rows) * config.n_kv_heads * config.head_dim * sizeof(float)),
        k_(bytes_),
        v_(bytes_) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (size_t i = 0; i < bytes_ / sizeof(float); ++i) k_.data()[i] = uniform(rng);
    for (size_t i = 0; i < bytes_ / sizeof(float); ++i) v_.data()[i] = uniform(rng);
  }
  const float* k() const { return k_.data(); }
  const float* v() const { return v_.data(); }
  KvLayerCache layer() const { return KvLayerCache{DType::kF32, k_.data(), v_.data()}; }

 private:
  size_t bytes_;
  GuardedArray k_, v_;
};

// Expects out[0, dh) to be softmax over keys j < keys of (q . k_j), times
// v_j, computed directly in double (within 1e-5), for KV head g of caches
// [rows, G, dh]: key j at cache row row(j).
template <typename Row>
void ExpectDirectAttention(const float* q, const float* out, const float* k, const float* v, int G,
                           int g, int dh, int keys, const Row& row) {
  std::vector<double> p(keys);
  double max = -INFINITY, sum = 0;
  for (int j = 0; j < keys; ++j) {
    const float* kj = k + (row(j) * G + g) * dh;
    double dot = 0;
    for (int i = 0; i < dh; ++i) dot += static_cast<double>(q[i]) * kj[i];
    p[j] = dot;
    max = std::max(max, dot);
  }
  for (double& x : p) sum += (x = std::exp(x - max));
  for (int i = 0; i < dh; ++i) {
    double expected = 0;
    for (int j = 0; j < keys; ++j) expected += p[j] / sum * v[(row(j) * G + g) * dh + i];
    EXPECT_NEAR(out[i], expected, 1e-5) << "channel " << i;
  }
}

// Eight sequences decode one token each on two threads, so that every piece
// is a whole sequence (all heads) and touches its blocks; their block tables
// cover every block of the cache, the first and the last included. The
// outputs must match softmax(q . k) v computed directly.
TEST(PagedAttentionTest, DecodeTilesReadOnlyTheirBlocksRows) {
  const AttentionConfig config = FourHeadsOverTwo();
  const int H = config.n_heads, G = config.n_kv_heads, dh = config.head_dim;
  constexpr int kBlockSize = 4, kSequences = 8, kBlocksEach = 2, kContext = 7;
  constexpr int kBlocks = kSequences * kBlocksEach;
  std::mt19937 rng(7);
  const RandomGuardedCache cache(config, kBlocks * kBlockSize, rng);

  // Sequence s holds blocks s and kBlocks - 1 - s: 0 and 15 among them.
  StepBatch step;
  step.Clear(kBlockSize);
  for (int s = 0; s < kSequences; ++s) {
    const std::vector<int32_t> table = {s, kBlocks - 1 - s};
    step.Add(std::vector<int32_t>{1}, kContext, table);
  }
  std::vector<float> q(static_cast<size_t>(kSequences) * H * dh);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : q) x = uniform(rng);
  std::vector<float> a(q.size(), NAN);

  WorkerPool pool(2);
  PagedAttention attention(config, BestKernelIsa(), &pool, /*parallel_min_macs=*/0);
  attention.Run(step, q.data(), cache.layer(), XlPositionKeys{},
                /*value_gates=*/nullptr, a.data());

  const int keys = kContext + 1;
  for (int s = 0; s < kSequences; ++s) {
    for (int h = 0; h < H; ++h) {
      SCOPED_TRACE(testing::Message() << "sequence " << s << " head " << h);
      const int64_t at = (static_cast<int64_t>(s) * H + h) * dh;
      ExpectDirectAttention(q.data() + at, a.data() + at, cache.k(), cache.v(), G, h / (H / G), dh,
                            keys, [&](int j) { return step.CacheRow(s, j); });
    }
  }
}

// A lone sequence decoding over a long context (more keys than
// kSplitScoresMinKeys) on two threads: its scores are computed first, its KV
// blocks shared out in ranges that read whole rows, and touching its values.
// Its outputs must be the bits of one thread and of the same token among
// eight sequences (whose tiles keep their heads together), must match
// softmax(q . k) v computed directly, and no read may leave its blocks' rows:
// its table holds the cache's first and last blocks.
TEST(PagedAttentionTest, LongContextDecodeSharesOutItsScoresWithTheSameBits) {
  const AttentionConfig config = FourHeadsOverTwo();
  const int H = config.n_heads, G = config.n_kv_heads, dh = config.head_dim;
  constexpr int kBlockSize = 16, kBlocks = 64, kContext = 700;
  constexpr int kLoneBlocks = (kContext + 1 + kBlockSize - 1) / kBlockSize;
  std::mt19937 rng(11);
  const RandomGuardedCache cache(config, kBlocks * kBlockSize, rng);

  // The lone sequence's blocks: the last one of the cache first, then
  // 0, 1, ... (the last one of its table is the cache's first).
  std::vector<int32_t> lone_table;
  lone_table.push_back(kBlocks - 1);
  for (int b = kLoneBlocks - 2; b >= 0; --b) lone_table.push_back(b);
  std::vector<float> q(static_cast<size_t>(8) * H * dh);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : q) x = uniform(rng);

  auto attend = [&](int threads, int sequences) {
    StepBatch step;
    step.Clear(kBlockSize);
    step.Add(std::vector<int32_t>{1}, kContext, lone_table);
    for (int s = 1; s < sequences; ++s) {  // short neighbours in blocks of their own
      step.Add(std::vector<int32_t>{1}, 20,
               std::vector<int32_t>{kLoneBlocks + 2 * s, kLoneBlocks + 2 * s + 1});
    }
    std::vector<float> a(static_cast<size_t>(sequences) * H * dh, NAN);
    WorkerPool pool(threads);
    PagedAttention attention(config, BestKernelIsa(), &pool, /*parallel_min_macs=*/0);
    attention.Run(step, q.data(), cache.layer(), XlPositionKeys{}, /*value_gates=*/nullptr,
                  a.data());
    a.resize(static_cast<size_t>(H) * dh);  // the lone sequence's
    return a;
  };
  const std::vector<float> split = attend(2, 1);
  const std::vector<float> one_thread = attend(1, 1);
  const std::vector<float> among_eight = attend(2, 8);
  EXPECT_EQ(0, std::memcmp(split.data(), one_thread.data(), split.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(split.data(), among_eight.data(), split.size() * sizeof(float)));

  const int keys = kContext + 1;
  const auto cache_row = [&](int j) {
    return static_cast<int64_t>(lone_table[j / kBlockSize]) * kBlockSize + j % kBlockSize;
  };
  for (int h = 0; h < H; ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    const int64_t at = static_cast<int64_t>(h) * dh;
    ExpectDirectAttention(q.data() + at, split.data() + at, cache.k(), cache.v(), G, h / (H / G),
                          dh, keys, cache_row);
  }
}

}  // namespace
}  // namespace switchserve::cpu
