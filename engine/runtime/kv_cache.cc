#include "engine/runtime/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace switchserve {

int64_t KvBytesPerToken(const ModelConfig& config, int bytes_per_element) {
  const AttentionConfig& attn = config.attention;
  const int64_t key_elems = static_cast<int64_t>(attn.n_kv_heads) * attn.head_dim;
  const int64_t value_elems = key_elems * attn.CachedValuesPerKvHead();
  return static_cast<int64_t>(config.n_layers) * (key_elems + value_elems) * bytes_per_element;
}

int64_t KvBlocksForBudget(const ModelConfig& config, int64_t budget_bytes, int block_size,
                          int bytes_per_element) {
  if (block_size <= 0 || budget_bytes <= 0) return 0;
  const int64_t per_block = KvBytesPerToken(config, bytes_per_element) * block_size;
  if (per_block <= 0) return 0;
  return budget_bytes / per_block;
}

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int block_size)
    : num_blocks_(std::max<int64_t>(num_blocks, 0)), block_size_(std::max(block_size, 1)) {
  free_.reserve(static_cast<size_t>(num_blocks_));
  // A stack: the back is handed out first, so push the highest id first.
  for (int64_t id = num_blocks_ - 1; id >= 0; --id) free_.push_back(static_cast<int32_t>(id));
}

int64_t KvBlockAllocator::BlocksFor(int64_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  return (num_tokens + block_size_ - 1) / block_size_;
}

int64_t KvBlockAllocator::ExtraBlocksFor(SequenceId id, int64_t num_tokens) const {
  auto it = tables_.find(id);
  const int64_t have = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.size());
  return std::max<int64_t>(0, BlocksFor(num_tokens) - have);
}

absl::Status KvBlockAllocator::Reserve(SequenceId id, int64_t num_tokens) {
  const int64_t extra = ExtraBlocksFor(id, num_tokens);
  if (extra > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: sequence ", id, " needs ", extra,
                                                     " more blocks, ", free_blocks(), " free"));
  }
  std::vector<int32_t>& table = tables_[id];
  for (int64_t i = 0; i < extra; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void KvBlockAllocator::Free(SequenceId id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  // Return in reverse so the lowest ids end up on top of the stack again.
  for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) free_.push_back(*b);
  tables_.erase(it);
}

const std::vector<int32_t>& KvBlockAllocator::BlockTable(SequenceId id) const {
  static const std::vector<int32_t>* const kEmpty = new std::vector<int32_t>();
  auto it = tables_.find(id);
  return it == tables_.end() ? *kEmpty : it->second;
}

}  // namespace switchserve
