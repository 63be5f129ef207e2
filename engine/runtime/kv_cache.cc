#include "engine/runtime/kv_cache.h"

#include <algorithm>
#include <limits>

#include "absl/hash/hash.h"
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
  return std::unique_ptr<KvCache>(
      new KvCache(num_blocks, block_size, bytes_per_token, options.prefix_caching));
}

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int block_size, bool prefix_caching)
    : num_blocks_(std::max<int64_t>(num_blocks, 0)),
      block_size_(std::max(block_size, 1)),
      prefix_caching_(prefix_caching) {
  free_.reserve(static_cast<size_t>(num_blocks_));
  // A stack: the back is handed out first, so push the highest id first.
  for (int64_t id = num_blocks_ - 1; id >= 0; --id) free_.push_back(static_cast<int32_t>(id));
  if (prefix_caching_) blocks_.resize(static_cast<size_t>(num_blocks_));
}

int64_t KvBlockAllocator::BlocksFor(int64_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  return (num_tokens + block_size_ - 1) / block_size_;
}

int64_t KvBlockAllocator::ExtraBlocksFor(SequenceId id, int64_t num_tokens) const {
  auto it = tables_.find(id);
  const int64_t have = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  return std::max<int64_t>(0, BlocksFor(num_tokens) - have);
}

int32_t KvBlockAllocator::Take() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    // Evict the least recently released cached block. Blocks chained after
    // it stay in index_ under its serial, which no lookup reaches any more;
    // they are evicted in their turn.
    auto oldest = evictable_.begin();
    block = oldest->second;
    evictable_.erase(oldest);
    Block& evicted = blocks_[static_cast<size_t>(block)];
    auto [first, last] = index_.equal_range(evicted.key);
    for (auto it = first; it != last; ++it) {
      if (it->second == block) {
        index_.erase(it);
        break;
      }
    }
    evicted = Block();
  }
  if (prefix_caching_) blocks_[static_cast<size_t>(block)].refs = 1;
  return block;
}

void KvBlockAllocator::Hold(int32_t block) {
  Block& held = blocks_[static_cast<size_t>(block)];
  if (held.refs++ == 0) evictable_.erase(held.released);
}

absl::Status KvBlockAllocator::Reserve(SequenceId id, int64_t num_tokens) {
  const int64_t extra = ExtraBlocksFor(id, num_tokens);
  if (extra > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache: sequence ", id, " needs ", extra,
                                                     " more blocks, ", free_blocks(), " free"));
  }
  std::vector<int32_t>& table = tables_[id].blocks;
  for (int64_t i = 0; i < extra; ++i) table.push_back(Take());
  return absl::OkStatus();
}

void KvBlockAllocator::Free(SequenceId id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  // Released last block first, so that a sequence's tail is evicted before
  // the prefix others may share; uncached blocks return in reverse so the
  // lowest ids end up on top of the stack again.
  const std::vector<int32_t>& table = it->second.blocks;
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    if (!prefix_caching_) {
      free_.push_back(*b);
      continue;
    }
    Block& block = blocks_[static_cast<size_t>(*b)];
    if (--block.refs > 0) continue;
    if (block.serial != 0) {
      block.released = next_release_++;
      evictable_.emplace(block.released, *b);
    } else {
      block = Block();
      free_.push_back(*b);
    }
  }
  tables_.erase(it);
}

const std::vector<int32_t>& KvBlockAllocator::BlockTable(SequenceId id) const {
  static const std::vector<int32_t>* const kEmpty = new std::vector<int32_t>();
  auto it = tables_.find(id);
  return it == tables_.end() ? *kEmpty : it->second.blocks;
}

size_t KvBlockAllocator::KeyOf(uint64_t parent, absl::Span<const int32_t> tokens) {
  return absl::HashOf(parent, tokens);
}

int32_t KvBlockAllocator::Lookup(uint64_t parent, absl::Span<const int32_t> tokens) const {
  auto [first, last] = index_.equal_range(KeyOf(parent, tokens));
  for (auto it = first; it != last; ++it) {
    const Block& block = blocks_[static_cast<size_t>(it->second)];
    if (block.parent == parent && absl::MakeConstSpan(block.tokens) == tokens) return it->second;
  }
  return -1;
}

uint64_t KvBlockAllocator::RootOf(std::string_view salt) {
  if (salt.empty()) return 0;
  return static_cast<uint64_t>(absl::HashOf(salt)) | (uint64_t{1} << 63);
}

PrefixHit KvBlockAllocator::FindPrefix(absl::Span<const int32_t> tokens, int64_t max_tokens,
                                       uint64_t root) const {
  PrefixHit hit;
  if (!prefix_caching_) return hit;
  const int64_t limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  uint64_t parent = root;
  const Block* resume = nullptr;
  for (int64_t end = block_size_; end <= limit; end += block_size_) {
    const int32_t found = Lookup(parent, tokens.subspan(end - block_size_, block_size_));
    if (found < 0) break;
    const Block& block = blocks_[static_cast<size_t>(found)];
    parent = block.serial;
    hit.matched = end;
    hit.blocks.push_back(found);
    if (block.resumable) {
      hit.tokens = end;
      resume = &block;
    }
  }
  if (resume != nullptr) hit.loads = resume->loads;
  hit.blocks.resize(static_cast<size_t>(hit.tokens / block_size_));
  return hit;
}

void KvBlockAllocator::AttachPrefix(SequenceId id, const PrefixHit& hit) {
  if (hit.blocks.empty()) return;
  Table& table = tables_[id];
  for (int32_t block : hit.blocks) Hold(block);
  table.blocks = hit.blocks;
  table.cached = static_cast<int64_t>(table.blocks.size());
  table.chain = blocks_[static_cast<size_t>(table.blocks.back())].serial;
}

void KvBlockAllocator::CacheBlock(SequenceId id, int64_t index, absl::Span<const int32_t> tokens,
                                  bool resumable, std::vector<int32_t> loads, uint64_t root) {
  if (!prefix_caching_) return;
  Table& table = tables_.at(id);
  if (table.cached == 0) table.chain = root;
  const absl::Span<const int32_t> own = tokens.subspan(index * block_size_, block_size_);
  const int32_t cached = Lookup(table.chain, own);
  if (cached >= 0) {
    // Computed twice (two sequences admitted before either was cached): the
    // first copy is the cache's; the chain goes on after it.
    Block& block = blocks_[static_cast<size_t>(cached)];
    if (resumable && !block.resumable) {
      block.resumable = true;
      block.loads = std::move(loads);
    }
    table.chain = block.serial;
  } else {
    Block& block = blocks_[static_cast<size_t>(table.blocks[static_cast<size_t>(index)])];
    block.serial = next_serial_++;
    block.parent = table.chain;
    block.tokens.assign(own.begin(), own.end());
    block.key = KeyOf(block.parent, own);
    block.resumable = resumable;
    block.loads = std::move(loads);
    index_.emplace(block.key, table.blocks[static_cast<size_t>(index)]);
    table.chain = block.serial;
  }
  table.cached = index + 1;
}

int64_t KvBlockAllocator::BlocksCached(SequenceId id) const {
  auto it = tables_.find(id);
  return it == tables_.end() ? 0 : it->second.cached;
}

}  // namespace switchserve
