// The paged KV cache as the runtime sees it: fixed-size blocks, a free list
// and a block table per sequence (KvBlockAllocator), and the one owner of
// the cache's size (KvCache), which sizes it from a byte budget and a token
// cap, initialises the backend's storage and holds the accounting. The
// storage the block ids index lives in the backend (host memory for the CPU
// backend, device memory for CUDA).
//
// Prefix caching (KvCacheOptions::prefix_caching): a full block whose K and V
// a step has computed stays in the cache after its sequence ends, keyed by
// its tokens and the chain of blocks before it, until its room is needed. A
// new sequence whose first blocks hold the same tokens takes them instead of
// computing them again. Kernels are batch- and chunk-invariant (DESIGN.md,
// isolation), so a block computed by another sequence holds the bits this one
// would have computed: a cached prefix changes what a step computes, never a
// logit.
//
// Thread-compatible: the engine (or runner) thread owns the cache.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_
#define SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model_config.h"
#include "engine/runtime/backend.h"

namespace switchserve {

using SequenceId = int64_t;

// Bytes of K and V cache one token needs in every layer together, for
// elements of `bytes_per_element` (4 for f32, 2 for bf16); saturates at
// INT64_MAX.
int64_t KvBytesPerToken(const ModelConfig& config, int bytes_per_element);

// How many blocks of `block_size` tokens of `bytes_per_token` each fit in
// `budget_bytes`.
int64_t KvBlocksForBudget(int64_t budget_bytes, int64_t bytes_per_token, int block_size);

// A cached prefix a sequence can start from: its first `tokens` tokens are
// in cached blocks. Under a dispatch that carries capacity-group loads, the
// prefix ends where the loads are known: `loads` are those of the group
// holding its last position (DispatchConfig::CarriesGroupLoads), empty where
// the next position opens a group or no loads are carried.
// `matched` is the length of the longest chain of cached blocks the tokens
// begin with (>= `tokens`): past `tokens`, blocks whose loads are not known.
// `blocks` are the cached blocks of the first `tokens`, in order.
struct PrefixHit {
  int64_t tokens = 0;
  std::vector<int32_t> loads;
  int64_t matched = 0;
  std::vector<int32_t> blocks;
};

class KvBlockAllocator {
 public:
  // With `prefix_caching`, full blocks that CacheBlock registers outlive
  // their sequence (see the file comment); without it, CacheBlock and
  // FindPrefix do nothing.
  KvBlockAllocator(int64_t num_blocks, int block_size, bool prefix_caching = false);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks a Reserve may take: never used, or cached and held by no sequence
  // (the least recently released of those is evicted first).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  // Blocks held by sequences.
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  // Cached blocks held by no sequence (part of free_blocks()).
  int64_t cached_free_blocks() const { return static_cast<int64_t>(evictable_.size()); }

  // Blocks needed to hold `num_tokens` tokens.
  int64_t BlocksFor(int64_t num_tokens) const;
  // Extra blocks sequence `id` needs to hold `num_tokens` tokens in total.
  int64_t ExtraBlocksFor(SequenceId id, int64_t num_tokens) const;

  // Grows `id`'s block table so it holds `num_tokens` tokens. On
  // RESOURCE_EXHAUSTED nothing is allocated.
  absl::Status Reserve(SequenceId id, int64_t num_tokens);
  // Releases all of `id`'s blocks: cached ones stay cached (evictable), the
  // rest go back to the free list. Unknown ids are ignored.
  void Free(SequenceId id);
  bool Has(SequenceId id) const { return tables_.count(id) != 0; }
  // The block table of `id` (empty for an unknown id). Stays valid until the
  // next Reserve, Free or AttachPrefix of that id.
  const std::vector<int32_t>& BlockTable(SequenceId id) const;

  // The root of the chain a salted sequence's blocks are cached under
  // (GenerationRequest::cache_salt): 0 for the empty salt, else a 63-bit hash
  // of the salt with the top bit set, which no cached block's serial has. A
  // block is found only under the root it was cached under.
  static uint64_t RootOf(std::string_view salt);

  // The longest cached prefix of `tokens` of at most `max_tokens` tokens, in
  // the chain from `root`, that ends at a block CacheBlock marked resumable;
  // 0 tokens when there is none (or prefix caching is off).
  PrefixHit FindPrefix(absl::Span<const int32_t> tokens, int64_t max_tokens,
                       uint64_t root = 0) const;
  // Gives `id`, which must hold no blocks, the cached blocks FindPrefix
  // found (`hit`, with nothing evicted since), as the start of its block
  // table. Cached blocks are never freed while a sequence holds them.
  void AttachPrefix(SequenceId id, const PrefixHit& hit);
  // Registers block `index` of `id`'s table, whose K and V are computed for
  // `tokens` (the sequence's tokens, at least through the block's end), in
  // the cache, after the blocks before it, which must be registered already
  // (blocks are registered in order; BlocksCached says how far). `resumable`:
  // a sequence may start right after this block, with `loads` (PrefixHit).
  // When an equal block is cached already, this one stays uncached and the
  // sequence's later blocks are chained after the cached one. The sequence's
  // first block is chained after `root` (RootOf its salt).
  void CacheBlock(SequenceId id, int64_t index, absl::Span<const int32_t> tokens, bool resumable,
                  std::vector<int32_t> loads, uint64_t root = 0);
  // How many of `id`'s first blocks are cached (registered or attached).
  int64_t BlocksCached(SequenceId id) const;

 private:
  struct Block {
    int32_t refs = 0;  // sequences holding it
    // Cached: a serial > 0, unique for the life of the allocator, keyed in
    // index_ by (parent, tokens).
    uint64_t serial = 0;
    uint64_t parent = 0;  // the serial of the cached block before it; the first: its root
    size_t key = 0;
    std::vector<int32_t> tokens;
    bool resumable = false;
    std::vector<int32_t> loads;
    uint64_t released = 0;  // evictable_'s key while held by no sequence
  };
  struct Table {
    std::vector<int32_t> blocks;
    int64_t cached = 0;  // the first `cached` blocks are in the cache's chain
    uint64_t chain = 0;  // the serial of the last of them; 0: none
  };

  static size_t KeyOf(uint64_t parent, absl::Span<const int32_t> tokens);
  // The cached block with these tokens after `parent`, or -1.
  int32_t Lookup(uint64_t parent, absl::Span<const int32_t> tokens) const;
  // A block for a sequence: a never-used one, else the least recently
  // released cached one, evicted. Requires free_blocks() > 0.
  int32_t Take();
  void Hold(int32_t block);

  int64_t num_blocks_;
  int block_size_;
  bool prefix_caching_;
  std::vector<int32_t> free_;  // stack; lowest ids handed out first
  std::unordered_map<SequenceId, Table> tables_;
  std::vector<Block> blocks_;
  std::unordered_multimap<size_t, int32_t> index_;  // KeyOf(parent, tokens) -> cached block
  std::map<uint64_t, int32_t> evictable_;           // release order -> cached block, refs 0
  uint64_t next_serial_ = 1;
  uint64_t next_release_ = 1;
};

struct KvCacheOptions {
  int block_size = 16;  // tokens per block
  // The cache gets as many blocks as `budget_bytes` holds at the backend's
  // KvBytesPerToken, but no more than `max_tokens` need (rounded up to whole
  // blocks). Each limit applies when > 0; at least one must be set.
  int64_t budget_bytes = 0;
  int64_t max_tokens = 0;
  // Fewer tokens than this (typically one full context) is an error.
  int64_t min_tokens = 0;
  // Keep computed blocks for later sequences with the same prefix (see the
  // file comment; `--enable-prefix-caching`).
  bool prefix_caching = false;
};

class KvCache {
 public:
  // Sizes the cache for `backend` and initialises its storage (the only
  // caller of Backend::InitKvCache). `backend` must outlive the cache.
  // INVALID_ARGUMENT for a non-positive block size, no limit, a size below
  // min_tokens (the message gives the bytes, tokens and bytes per token) or
  // more than 2^31 - 1 blocks, all before the backend allocates anything; the
  // backend's own errors (RESOURCE_EXHAUSTED: more than its memory) pass
  // through.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(Backend* backend,
                                                         const KvCacheOptions& options);

  int block_size() const { return allocator_.block_size(); }
  int64_t num_blocks() const { return allocator_.num_blocks(); }
  int64_t capacity_tokens() const { return num_blocks() * block_size(); }
  int64_t bytes_per_token() const { return bytes_per_token_; }
  int64_t bytes() const { return capacity_tokens() * bytes_per_token_; }

  // The block accounting (scheduler, runner).
  KvBlockAllocator& allocator() { return allocator_; }
  const KvBlockAllocator& allocator() const { return allocator_; }

 private:
  KvCache(int64_t num_blocks, int block_size, int64_t bytes_per_token, bool prefix_caching)
      : allocator_(num_blocks, block_size, prefix_caching), bytes_per_token_(bytes_per_token) {}

  KvBlockAllocator allocator_;
  int64_t bytes_per_token_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_
