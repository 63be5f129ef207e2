// Paged KV cache accounting: fixed-size blocks, a free list, and a block table
// per sequence. This is bookkeeping only; the storage the block ids index lives
// in the backend (host memory for the CPU backend, device memory for CUDA).
//
// Thread-compatible: the scheduler thread owns the allocator.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_
#define SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_config.h"

namespace switchserve {

using SequenceId = int64_t;

// Bytes of K and V cache one token needs in every layer together, for
// elements of `bytes_per_element` (4 for f32, 2 for bf16).
int64_t KvBytesPerToken(const ModelConfig& config, int bytes_per_element);

// How many blocks of `block_size` tokens fit in `budget_bytes`.
int64_t KvBlocksForBudget(const ModelConfig& config, int64_t budget_bytes, int block_size,
                          int bytes_per_element);

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

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_KV_CACHE_H_
