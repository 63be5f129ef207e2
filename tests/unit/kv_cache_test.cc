#include "engine/runtime/kv_cache.h"

#include <set>

#include "gtest/gtest.h"

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
  EXPECT_EQ(KvBlocksForBudget(config, per_block * 10 + per_block - 1, 16, 4), 10);
  EXPECT_EQ(KvBlocksForBudget(config, 0, 16, 4), 0);
}

}  // namespace
}  // namespace switchserve
