#include "engine/runtime/kv_cache.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/model/host_memory.h"

namespace switchserve {

int64_t KvBytesPerToken(const ModelConfig& config, int bytes_per_element) {
  const AttentionConfig& attn = config.attention;
  // Saturating: the dimensions come from config.json.
  const int64_t key_elems = SaturatingMul(attn.n_kv_heads, attn.head_dim);
  const int64_t value_elems = SaturatingMul(key_elems, attn.CachedValuesPerKvHead());
  return SaturatingMul(SaturatingMul(config.n_layers, SaturatingAdd(key_elems, value_elems)),
                       bytes_per_element);
}

int64_t KvBlocksForBudget(int64_t budget_bytes, int64_t bytes_per_token, int block_size) {
  if (block_size <= 0 || budget_bytes <= 0 || bytes_per_token <= 0) return 0;
  int64_t block_bytes = 0;
  if (__builtin_mul_overflow(bytes_per_token, int64_t{block_size}, &block_bytes)) return 0;
  return budget_bytes / block_bytes;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(Backend* backend,
                                                         const KvCacheOptions& options) {
  const int block_size = options.block_size;
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: block_size ", block_size, " must be > 0"));
  }
  if (options.budget_bytes <= 0 && options.max_tokens <= 0) {
    return absl::InvalidArgumentError("KV cache: neither a byte budget nor a token cap");
  }
  const int64_t bytes_per_token = backend->KvBytesPerToken();
  if (bytes_per_token <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: the backend needs ", bytes_per_token, " bytes per token"));
  }
  int64_t num_blocks = std::numeric_limits<int64_t>::max();
  if (options.budget_bytes > 0) {
    num_blocks = KvBlocksForBudget(options.budget_bytes, bytes_per_token, block_size);
  }
  if (options.max_tokens > 0) {
    num_blocks = std::min(num_blocks, options.max_tokens / block_size +
                                          (options.max_tokens % block_size != 0 ? 1 : 0));
  }
  const int64_t tokens = SaturatingMul(num_blocks, block_size);
  if (tokens < std::max<int64_t>(options.min_tokens, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: room for ", tokens, " tokens (",
                     SaturatingMul(tokens, bytes_per_token), " bytes at ", bytes_per_token,
                     " bytes per token), fewer than the ", options.min_tokens, " needed"));
  }
  // Block tables hold 32-bit block ids.
  if (num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: ", num_blocks, " blocks, more than 2^31 - 1 block ids"));
  }
  if (absl::Status status = backend->InitKvCache(num_blocks, block_size); !status.ok()) {
    return status;
  }
  return std::unique_ptr<KvCache>(new KvCache(num_blocks, block_size, bytes_per_token));
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
