#include "engine/runtime/sequence_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchserve {

absl::StatusOr<std::unique_ptr<SequenceRunner>> SequenceRunner::Create(
    Backend* backend, const ModelConfig& config, const SequenceRunnerOptions& options) {
  if (options.prefill_chunk <= 0) {
    return absl::InvalidArgumentError("sequence runner: prefill_chunk must be > 0");
  }
  KvCacheOptions cache;
  cache.block_size = options.block_size;
  cache.max_tokens = options.max_tokens > 0 ? options.max_tokens : config.max_seq_len;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend, cache);
  if (!kv_cache.ok()) return kv_cache.status();
  return std::unique_ptr<SequenceRunner>(
      new SequenceRunner(backend, config, options, *std::move(kv_cache)));
}

SequenceRunner::SequenceRunner(Backend* backend, const ModelConfig& config,
                               const SequenceRunnerOptions& options,
                               std::unique_ptr<KvCache> kv_cache)
    : backend_(backend),
      config_(config),
      options_(options),
      kv_cache_(std::move(kv_cache)),
      allocator_(kv_cache_->allocator()) {}

int64_t SequenceRunner::Length(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second.length;
}

absl::StatusOr<std::vector<float>> SequenceRunner::Append(SequenceId id,
                                                          absl::Span<const int32_t> tokens,
                                                          bool all_logits,
                                                          StepRoutingStats* stats) {
  if (tokens.empty()) return absl::InvalidArgumentError("sequence runner: no tokens to append");
  int64_t length = Length(id);
  if (length + static_cast<int64_t>(tokens.size()) > config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence runner: ", length + tokens.size(),
                                                   " tokens exceed max_seq_len ",
                                                   config_.max_seq_len));
  }
  absl::Status status = allocator_.Reserve(id, length + static_cast<int64_t>(tokens.size()));
  if (!status.ok()) return status;

  Entry& entry = sequences_[id];
  std::vector<float> logits;
  StepBatch batch;
  StepOutput output;
  for (size_t begin = 0; begin < tokens.size(); begin += options_.prefill_chunk) {
    const size_t end = std::min(tokens.size(), begin + options_.prefill_chunk);
    batch.Clear(allocator_.block_size());
    StepSequence& sequence = batch.Add(tokens.subspan(begin, end - begin),
                                       static_cast<int32_t>(length), allocator_.BlockTable(id));
    sequence.group_loads = &entry.group_loads;
    const bool last = end == tokens.size();
    sequence.logits =
        all_logits ? LogitsMode::kAll : (last ? LogitsMode::kLast : LogitsMode::kNone);
    status = backend_->Forward(batch, &output);
    if (!status.ok()) return status;
    logits.insert(logits.end(), output.logits.begin(), output.logits.end());
    if (stats != nullptr) {
      if (stats->routers.empty()) {
        *stats = output.stats;
      } else {
        stats->Add(output.stats);
      }
    }
    length += static_cast<int64_t>(end - begin);
    entry.length = length;
  }
  return logits;
}

void SequenceRunner::Release(SequenceId id) {
  allocator_.Free(id);
  sequences_.erase(id);
}

}  // namespace switchserve
