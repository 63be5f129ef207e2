// The paged KV cache as the runtime sees it: fixed-size blocks, a free list
// and a block table per sequence (KvBlockAllocator), and the one owner of
// the cache's size (KvCache), which sizes it from a byte budget and a token
// cap, initialises the backend's storage and holds the accounting. The
// storage the block ids index lives in the backend (host memory for the CPU
// backend, device memory for CUDA).
//
// Thread-compatible: the engine (or runner) thread owns the cache.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_
#define SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

class KvBlockAllocator {
 public:
  KvBlockAllocator(int64_t num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }

  // Blocks needed to hold `num_tokens` tokens.
  int64_t BlocksFor(int64_t num_tokens) const;
  // Extra blocks sequence `id` needs to hold `num_tokens` tokens in total.
  int64_t ExtraBlocksFor(SequenceId id, int64_t num_tokens) const;

  // Grows `id`'s block table so it holds `num_tokens` tokens. On
  // RESOURCE_EXHAUSTED nothing is allocated.
  absl::Status Reserve(SequenceId id, int64_t num_tokens);
  // Returns all of `id`'s blocks to the free list. Unknown ids are ignored.
  void Free(SequenceId id);
  bool Has(SequenceId id) const { return tables_.count(id) != 0; }
  // The block table of `id` (empty for an unknown id). Stays valid until the
  // next Reserve or Free of that id.
  const std::vector<int32_t>& BlockTable(SequenceId id) const;

 private:
  int64_t num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;  // stack; lowest ids handed out first
  std::unordered_map<SequenceId, std::vector<int32_t>> tables_;
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
  KvCache(int64_t num_blocks, int block_size, int64_t bytes_per_token)
      : allocator_(num_blocks, block_size), bytes_per_token_(bytes_per_token) {}

  KvBlockAllocator allocator_;
  int64_t bytes_per_token_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_
