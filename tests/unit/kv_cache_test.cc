#include "engine/runtime/kv_cache.h"

#include <algorithm>
#include <limits>
#include <map>
#include <random>
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

// Prefix caching: blocks of 4 tokens.
std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = first + i;
  return tokens;
}

// Registers every full block of `id` up to `tokens.size()`, all resumable,
// with loads {index}.
void CacheAll(KvBlockAllocator& alloc, SequenceId id, const std::vector<int32_t>& tokens) {
  const int64_t blocks = static_cast<int64_t>(alloc.BlockTable(id).size());
  for (int64_t index = alloc.BlocksCached(id);
       index < blocks && (index + 1) * alloc.block_size() <= static_cast<int64_t>(tokens.size());
       ++index) {
    alloc.CacheBlock(id, index, tokens, /*resumable=*/true, {static_cast<int32_t>(index)});
  }
}

TEST(KvCacheTest, WithoutPrefixCachingNothingIsCached) {
  KvBlockAllocator alloc(8, 4);
  const std::vector<int32_t> tokens = Tokens(10, 100);
  ASSERT_TRUE(alloc.Reserve(1, 10).ok());
  CacheAll(alloc, 1, tokens);
  EXPECT_EQ(alloc.BlocksCached(1), 0);
  alloc.Free(1);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9).tokens, 0);
  EXPECT_EQ(alloc.free_blocks(), 8);
  EXPECT_EQ(alloc.cached_free_blocks(), 0);
}

TEST(KvCacheTest, CachedBlocksOutliveTheirSequenceAndAreShared) {
  KvBlockAllocator alloc(8, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = Tokens(10, 100);
  ASSERT_TRUE(alloc.Reserve(1, 10).ok());
  const std::vector<int32_t> table = alloc.BlockTable(1);
  CacheAll(alloc, 1, tokens);  // blocks 0 and 1; block 2 holds 2 tokens
  EXPECT_EQ(alloc.BlocksCached(1), 2);
  alloc.Free(1);
  // Free for a Reserve, but still cached.
  EXPECT_EQ(alloc.free_blocks(), 8);
  EXPECT_EQ(alloc.used_blocks(), 0);
  EXPECT_EQ(alloc.cached_free_blocks(), 2);

  PrefixHit hit = alloc.FindPrefix(tokens, 9);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.loads, std::vector<int32_t>{1});     // block 1's
  EXPECT_EQ(alloc.FindPrefix(tokens, 7).tokens, 4);  // at most max_tokens
  std::vector<int32_t> other = tokens;
  other[5] = 7;  // the second block differs
  EXPECT_EQ(alloc.FindPrefix(other, 9).tokens, 4);
  other[0] = 7;  // so does the first: the second's equal tokens do not count
  other[5] = tokens[5];
  EXPECT_EQ(alloc.FindPrefix(other, 9).tokens, 0);

  // Two sequences share the cached blocks; they are freed by neither.
  alloc.AttachPrefix(2, alloc.FindPrefix(tokens, 8));
  alloc.AttachPrefix(3, alloc.FindPrefix(tokens, 4));
  EXPECT_EQ(alloc.BlockTable(2), (std::vector<int32_t>{table[0], table[1]}));
  EXPECT_EQ(alloc.BlockTable(3), (std::vector<int32_t>{table[0]}));
  EXPECT_EQ(alloc.BlocksCached(2), 2);
  EXPECT_EQ(alloc.used_blocks(), 2);
  EXPECT_EQ(alloc.cached_free_blocks(), 0);
  ASSERT_TRUE(alloc.Reserve(2, 12).ok());
  EXPECT_EQ(alloc.BlockTable(2).size(), 3u);
  alloc.Free(2);
  EXPECT_EQ(alloc.used_blocks(), 1);  // sequence 3 still holds block 0
  EXPECT_EQ(alloc.cached_free_blocks(), 1);
  alloc.Free(3);
  EXPECT_EQ(alloc.cached_free_blocks(), 2);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9).tokens, 8);
}

// Blocks cached under one salt's root are found under that root only; a
// sequence that attached a salted prefix chains its own blocks after it.
TEST(KvCacheTest, ASaltedChainIsFoundOnlyUnderItsSalt) {
  EXPECT_EQ(KvBlockAllocator::RootOf(""), 0u);
  const uint64_t a = KvBlockAllocator::RootOf("tenant-a");
  const uint64_t b = KvBlockAllocator::RootOf("tenant-b");
  EXPECT_NE(a, b);
  EXPECT_EQ(a, KvBlockAllocator::RootOf("tenant-a"));
  EXPECT_NE(a >> 63, 0u);  // apart from every block's serial
  KvBlockAllocator alloc(8, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = Tokens(10, 100);
  ASSERT_TRUE(alloc.Reserve(1, 10).ok());
  alloc.CacheBlock(1, 0, tokens, /*resumable=*/true, {}, a);
  alloc.CacheBlock(1, 1, tokens, /*resumable=*/true, {}, a);
  alloc.Free(1);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9, a).tokens, 8);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9).tokens, 0);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9, b).tokens, 0);

  // Unsalted, the same tokens are cached again, apart from a's.
  ASSERT_TRUE(alloc.Reserve(2, 10).ok());
  alloc.CacheBlock(2, 0, tokens, /*resumable=*/true, {});
  alloc.Free(2);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9).tokens, 4);
  EXPECT_EQ(alloc.FindPrefix(tokens, 9, a).tokens, 8);
  EXPECT_EQ(alloc.cached_free_blocks(), 3);

  // A sequence under a that attached block 0 and computed block 1 again
  // finds a's block 1 cached (its own copy is not cached), and chains
  // after it.
  alloc.AttachPrefix(3, alloc.FindPrefix(tokens, 4, a));
  ASSERT_TRUE(alloc.Reserve(3, 12).ok());
  alloc.CacheBlock(3, 1, tokens, /*resumable=*/true, {}, a);
  const std::vector<int32_t> longer = Tokens(12, 100);
  alloc.CacheBlock(3, 2, longer, /*resumable=*/true, {}, a);
  EXPECT_EQ(alloc.BlocksCached(3), 3);
  alloc.Free(3);
  EXPECT_EQ(alloc.cached_free_blocks(), 4);
  EXPECT_EQ(alloc.FindPrefix(longer, 12, a).tokens, 12);
  EXPECT_EQ(alloc.FindPrefix(longer, 12).tokens, 4);
}

TEST(KvCacheTest, PrefixEndsAtTheLastResumableBlock) {
  KvBlockAllocator alloc(8, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = Tokens(12, 0);
  ASSERT_TRUE(alloc.Reserve(1, 12).ok());
  alloc.CacheBlock(1, 0, tokens, /*resumable=*/true, {});
  alloc.CacheBlock(1, 1, tokens, /*resumable=*/false, {});
  alloc.CacheBlock(1, 2, tokens, /*resumable=*/true, {5, 6});
  alloc.Free(1);
  PrefixHit hit = alloc.FindPrefix(tokens, 12);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(hit.loads, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(hit.matched, 12);
  hit = alloc.FindPrefix(tokens, 11);  // block 1 ends where the loads are unknown
  EXPECT_EQ(hit.tokens, 4);
  EXPECT_TRUE(hit.loads.empty());
  EXPECT_EQ(hit.matched, 8);  // the chain goes on past it
}

TEST(KvCacheTest, LeastRecentlyReleasedBlocksAreEvictedTailFirst) {
  KvBlockAllocator alloc(4, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> a = Tokens(8, 0);
  const std::vector<int32_t> b = Tokens(8, 50);
  ASSERT_TRUE(alloc.Reserve(1, 8).ok());
  CacheAll(alloc, 1, a);
  alloc.Free(1);
  ASSERT_TRUE(alloc.Reserve(2, 8).ok());
  CacheAll(alloc, 2, b);
  alloc.Free(2);
  EXPECT_EQ(alloc.cached_free_blocks(), 4);
  EXPECT_EQ(alloc.free_blocks(), 4);
  // One block: a's tail goes first (released before b's, and after a's head).
  ASSERT_TRUE(alloc.Reserve(3, 4).ok());
  EXPECT_EQ(alloc.FindPrefix(a, 8).tokens, 4);
  EXPECT_EQ(alloc.FindPrefix(b, 8).tokens, 8);
  // Two more: a's head, then b's tail.
  ASSERT_TRUE(alloc.Reserve(3, 12).ok());
  EXPECT_EQ(alloc.FindPrefix(a, 8).tokens, 0);
  EXPECT_EQ(alloc.FindPrefix(b, 8).tokens, 4);
  // A held block is never evicted: one left to take.
  alloc.AttachPrefix(4, alloc.FindPrefix(b, 4));
  EXPECT_EQ(alloc.free_blocks(), 0);
  EXPECT_EQ(alloc.Reserve(5, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alloc.FindPrefix(b, 8).tokens, 4);
}

// A sequence that computed a cached block again chains its next block after
// the cached copy, which it does not hold: that copy can be evicted while its
// successor stays cached. The successor must not be found through whatever
// the evicted block holds next.
TEST(KvCacheTest, AnEvictedBlocksSuccessorsAreNotFoundThroughItsReuse) {
  KvBlockAllocator alloc(3, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> a = Tokens(8, 0);
  ASSERT_TRUE(alloc.Reserve(1, 4).ok());
  ASSERT_TRUE(alloc.Reserve(2, 8).ok());
  const int32_t head = alloc.BlockTable(1)[0];
  CacheAll(alloc, 1, a);  // a's first block
  CacheAll(alloc, 2, a);  // its copy stays uncached; its second block follows `head`
  alloc.Free(1);
  ASSERT_TRUE(alloc.Reserve(3, 4).ok());  // evicts `head`, the only block free
  ASSERT_EQ(alloc.BlockTable(3)[0], head);
  std::vector<int32_t> c = a;
  c[0] = 99;
  CacheAll(alloc, 3, std::vector<int32_t>(c.begin(), c.begin() + 4));
  alloc.Free(3);
  alloc.Free(2);
  EXPECT_EQ(alloc.cached_free_blocks(), 2);  // c's first, a's second
  EXPECT_EQ(alloc.FindPrefix(a, 8).tokens, 0);
  EXPECT_EQ(alloc.FindPrefix(c, 8).tokens, 4);
}

TEST(KvCacheTest, ABlockComputedTwiceIsCachedOnceAndTheChainGoesOn) {
  KvBlockAllocator alloc(8, 4, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = Tokens(12, 0);
  ASSERT_TRUE(alloc.Reserve(1, 8).ok());
  ASSERT_TRUE(alloc.Reserve(2, 12).ok());
  CacheAll(alloc, 1, tokens);
  CacheAll(alloc, 2, tokens);  // blocks 0 and 1 equal sequence 1's, block 2 new
  EXPECT_EQ(alloc.BlocksCached(1), 2);
  EXPECT_EQ(alloc.BlocksCached(2), 3);
  alloc.Free(1);
  alloc.Free(2);
  // Sequence 2's copies of blocks 0 and 1 were not cached: back in the free
  // list; its block 2 chains after sequence 1's block 1.
  EXPECT_EQ(alloc.cached_free_blocks(), 3);
  EXPECT_EQ(alloc.free_blocks(), 8);
  EXPECT_EQ(alloc.FindPrefix(tokens, 12).tokens, 12);
}

// Random sequences over a two-token alphabet (so prefixes repeat), admitted
// as the scheduler admits them and freed in random order, in a cache too
// small for all of them: every block a sequence is given from the cache
// holds that sequence's tokens, no sequence writes a block another holds,
// and the counts add up.
TEST(KvCacheTest, CachedBlocksAlwaysHoldTheirTokensUnderRandomUse) {
  constexpr int kBlock = 4;
  KvBlockAllocator alloc(24, kBlock, /*prefix_caching=*/true);
  std::mt19937 rng(7);
  std::map<int32_t, std::vector<int32_t>> written;  // block -> the tokens computed into it
  std::map<SequenceId, std::vector<int32_t>> live;  // sequence -> its tokens
  SequenceId next_id = 1;
  int64_t hits = 0;
  for (int round = 0; round < 4000; ++round) {
    if (live.size() < 5 && rng() % 2 == 0) {
      const SequenceId id = next_id++;
      std::vector<int32_t> tokens(5 + rng() % 20);
      for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 2);
      const PrefixHit hit = alloc.FindPrefix(tokens, static_cast<int64_t>(tokens.size()) - 1);
      alloc.AttachPrefix(id, hit);
      const std::vector<int32_t> attached = alloc.BlockTable(id);
      ASSERT_EQ(static_cast<int64_t>(attached.size()) * kBlock, hit.tokens);
      for (size_t b = 0; b < attached.size(); ++b) {
        const std::vector<int32_t> want(tokens.begin() + static_cast<int64_t>(b) * kBlock,
                                        tokens.begin() + static_cast<int64_t>(b + 1) * kBlock);
        ASSERT_EQ(written[attached[b]], want) << "round " << round << ", block " << b;
      }
      hits += hit.tokens;
      if (!alloc.Reserve(id, static_cast<int64_t>(tokens.size())).ok()) {
        alloc.Free(id);
        continue;
      }
      // Compute the rest: blocks nobody else holds.
      const std::vector<int32_t>& table = alloc.BlockTable(id);
      for (size_t b = attached.size(); b < table.size(); ++b) {
        for (const auto& [other, other_tokens] : live) {
          const std::vector<int32_t>& held = alloc.BlockTable(other);
          ASSERT_EQ(std::find(held.begin(), held.end(), table[b]), held.end())
              << "round " << round << ": block " << table[b] << " is sequence " << other << "'s";
        }
        const int64_t begin = static_cast<int64_t>(b) * kBlock;
        const int64_t end = std::min<int64_t>(begin + kBlock, static_cast<int64_t>(tokens.size()));
        written[table[b]].assign(tokens.begin() + begin, tokens.begin() + end);
      }
      for (int64_t index = alloc.BlocksCached(id);
           (index + 1) * kBlock <= static_cast<int64_t>(tokens.size()); ++index) {
        alloc.CacheBlock(id, index, tokens, /*resumable=*/rng() % 3 != 0, {});
      }
      live.emplace(id, std::move(tokens));
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      alloc.Free(it->first);
      live.erase(it);
    }
    std::set<int32_t> held;
    for (const auto& [id, tokens] : live) {
      for (int32_t b : alloc.BlockTable(id)) held.insert(b);
    }
    ASSERT_EQ(alloc.used_blocks(), static_cast<int64_t>(held.size())) << "round " << round;
    ASSERT_LE(alloc.cached_free_blocks(), alloc.free_blocks());
  }
  EXPECT_GT(hits, 1000);  // the cache was used
}

}  // namespace
}  // namespace switchserve
