#include "engine/runtime/kv_cache.h"

#include <limits>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "tests/util/fake_backend.h"

namespace switchserve {
namespace {

TEST(KvCacheTest, ReserveGrowsBlockTable) {
  KvBlockAllocator alloc(8, 4);
  EXPECT_EQ(alloc.BlocksFor(0), 0);
  EXPECT_EQ(alloc.BlocksFor(4), 1);
  EXPECT_EQ(alloc.BlocksFor(5), 2);
  ASSERT_TRUE(alloc.Reserve(1, 5).ok());
  EXPECT_EQ(alloc.BlockTable(1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(alloc.ExtraBlocksFor(1, 8), 0);
  EXPECT_EQ(alloc.ExtraBlocksFor(1, 9), 1);
  ASSERT_TRUE(alloc.Reserve(1, 9).ok());
  EXPECT_EQ(alloc.BlockTable(1), (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(alloc.Reserve(1, 3).ok());  // shrinking requests allocate nothing
  EXPECT_EQ(alloc.BlockTable(1).size(), 3u);
  EXPECT_EQ(alloc.used_blocks(), 3);
  EXPECT_EQ(alloc.free_blocks(), 5);
}

TEST(KvCacheTest, ExhaustionAllocatesNothing) {
  KvBlockAllocator alloc(4, 2);
  ASSERT_TRUE(alloc.Reserve(1, 4).ok());
  ASSERT_TRUE(alloc.Reserve(2, 1).ok());
  const absl::Status s = alloc.Reserve(2, 7);  // needs 3 more, 1 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.BlockTable(2).size(), 1u);
  EXPECT_EQ(alloc.free_blocks(), 1);
  EXPECT_FALSE(alloc.Reserve(3, 5).ok());
  EXPECT_FALSE(alloc.Has(3));
  EXPECT_EQ(alloc.free_blocks(), 1);
}

TEST(KvCacheTest, FreeAndReuse) {
  KvBlockAllocator alloc(4, 2);
  ASSERT_TRUE(alloc.Reserve(1, 4).ok());
  ASSERT_TRUE(alloc.Reserve(2, 4).ok());
  EXPECT_EQ(alloc.free_blocks(), 0);
  alloc.Free(1);
  alloc.Free(99);  // unknown: ignored
  EXPECT_FALSE(alloc.Has(1));
  EXPECT_TRUE(alloc.BlockTable(1).empty());
  EXPECT_EQ(alloc.free_blocks(), 2);
  ASSERT_TRUE(alloc.Reserve(3, 4).ok());
  EXPECT_EQ(alloc.BlockTable(3), (std::vector<int32_t>{0, 1}));
  std::set<int32_t> all(alloc.BlockTable(2).begin(), alloc.BlockTable(2).end());
  for (int32_t b : alloc.BlockTable(3)) EXPECT_TRUE(all.insert(b).second);
  EXPECT_EQ(all.size(), 4u);
}

TEST(KvCacheTest, BudgetSizing) {
  ModelConfig config;
  config.n_layers = 2;
  config.attention.kind = AttentionKind::kSwitchHead;
  config.attention.n_heads = 4;
  config.attention.n_kv_heads = 2;
  config.attention.head_dim = 8;
  config.attention.n_experts = 4;
  // Source routing: K and V each G*dh per layer.
  EXPECT_EQ(KvBytesPerToken(config, 4), 2 * (16 + 16) * 4);
  config.attention.value_routing = ValueRouting::kDestination;
  EXPECT_EQ(KvBytesPerToken(config, 4), 2 * (16 + 64) * 4);
  EXPECT_EQ(KvBytesPerToken(config, 2), 2 * (16 + 64) * 2);
  const int64_t per_block = 2 * (16 + 64) * 4 * 16;
  EXPECT_EQ(KvBlocksForBudget(per_block * 10 + per_block - 1, KvBytesPerToken(config, 4), 16), 10);
  EXPECT_EQ(KvBlocksForBudget(0, KvBytesPerToken(config, 4), 16), 0);
}

// A backend that records how KvCache initialised it, or refuses to.
class RecordingBackend : public testing::FakeBackend {
 public:
  RecordingBackend() : FakeBackend(256, 256) {}  // 8 bytes per token
  absl::Status InitKvCache(int64_t num_blocks, int tokens_per_block) override {
    ++calls;
    blocks = num_blocks;
    block_size = tokens_per_block;
    if (refuse) return absl::ResourceExhaustedError("no memory");
    return FakeBackend::InitKvCache(num_blocks, tokens_per_block);
  }
  int calls = 0;
  int64_t blocks = 0;
  int block_size = 0;
  bool refuse = false;
};

TEST(KvCacheTest, SizesFromBudgetAndCapAndInitialisesTheBackend) {
  RecordingBackend backend;
  KvCacheOptions options;
  options.block_size = 16;
  options.budget_bytes = 8 * 16 * 10 + 100;  // 10 blocks and a bit
  auto by_budget = KvCache::Create(&backend, options);
  ASSERT_TRUE(by_budget.ok()) << by_budget.status();
  EXPECT_EQ((*by_budget)->num_blocks(), 10);
  EXPECT_EQ((*by_budget)->block_size(), 16);
  EXPECT_EQ((*by_budget)->capacity_tokens(), 160);
  EXPECT_EQ((*by_budget)->bytes(), 8 * 160);
  EXPECT_EQ((*by_budget)->allocator().num_blocks(), 10);
  EXPECT_EQ((*by_budget)->allocator().block_size(), 16);
  EXPECT_EQ(backend.calls, 1);
  EXPECT_EQ(backend.blocks, 10);
  EXPECT_EQ(backend.block_size, 16);

  options.max_tokens = 100;  // the cap wins: ceil(100 / 16) blocks
  auto capped = KvCache::Create(&backend, options);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ((*capped)->num_blocks(), 7);
  EXPECT_EQ(backend.blocks, 7);

  options.budget_bytes = 0;  // the cap alone
  options.max_tokens = 33;
  auto cap_only = KvCache::Create(&backend, options);
  ASSERT_TRUE(cap_only.ok());
  EXPECT_EQ((*cap_only)->num_blocks(), 3);
}

TEST(KvCacheTest, RejectsTooSmallOrUnboundedCaches) {
  RecordingBackend backend;
  KvCacheOptions options;
  options.block_size = 16;
  options.budget_bytes = 8 * 16 * 10;
  options.min_tokens = 161;  // one token more than fits
  EXPECT_EQ(KvCache::Create(&backend, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.min_tokens = 160;
  EXPECT_TRUE(KvCache::Create(&backend, options).ok());
  options.budget_bytes = 8 * 15;  // not even one block
  options.min_tokens = 0;
  EXPECT_EQ(KvCache::Create(&backend, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.budget_bytes = 0;  // no limit at all
  EXPECT_EQ(KvCache::Create(&backend, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.max_tokens = 64;
  options.block_size = 0;
  EXPECT_EQ(KvCache::Create(&backend, options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.calls, 1);  // only the valid one reached the backend

  backend.refuse = true;
  options.block_size = 16;
  EXPECT_EQ(KvCache::Create(&backend, options).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Sizes from config.json and flags never overflow and never reach the
// backend when they cannot work.
TEST(KvCacheTest, AbsurdSizesAreRefusedBeforeTheBackendAllocates) {
  ModelConfig config;
  config.n_layers = std::numeric_limits<int32_t>::max();
  config.attention.n_kv_heads = std::numeric_limits<int32_t>::max();
  config.attention.head_dim = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(KvBytesPerToken(config, 4), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(KvBlocksForBudget(std::numeric_limits<int64_t>::max(),
                              std::numeric_limits<int64_t>::max(), 1024),
            0);

  RecordingBackend backend;
  KvCacheOptions options;
  options.block_size = 16;
  options.budget_bytes = 1 << 20;
  options.min_tokens = std::numeric_limits<int32_t>::max();  // max_seq_len 2^31 - 1
  absl::Status status = KvCache::Create(&backend, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("2147483647 needed"), std::string::npos) << status;

  // More blocks than 32-bit block ids can name.
  options.min_tokens = 0;
  options.block_size = 1;
  options.budget_bytes = std::numeric_limits<int64_t>::max();
  options.max_tokens = int64_t{std::numeric_limits<int32_t>::max()} * 64;
  status = KvCache::Create(&backend, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("block ids"), std::string::npos) << status;
  EXPECT_EQ(backend.calls, 0);
}

}  // namespace
}  // namespace switchserve
