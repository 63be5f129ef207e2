// Runs sequences through a Backend one at a time, without a scheduler: the
// offline `score` command and tests use it. It owns the backend's KvCache,
// sized for `max_tokens`. Each sequence carries its capacity group loads
// (GroupLoads) from chunk to chunk and from one Append to the next, as the
// engine's requests do, so a sequence appended in pieces routes as in one
// pass.
//
// Not thread-safe.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_SEQUENCE_RUNNER_H_
#define SWITCHSERVE_ENGINE_RUNTIME_SEQUENCE_RUNNER_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model_config.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/kv_cache.h"

namespace switchserve {

struct SequenceRunnerOptions {
  int block_size = 16;
  int64_t max_tokens = 0;       // cache capacity in tokens; 0: one max_seq_len sequence
  int32_t prefill_chunk = 512;  // tokens per Forward call while appending
};

class SequenceRunner {
 public:
  // `backend` must outlive the runner; its KV cache is initialised here.
  static absl::StatusOr<std::unique_ptr<SequenceRunner>> Create(
      Backend* backend, const ModelConfig& config, const SequenceRunnerOptions& options = {});

  // Appends `tokens` to sequence `id` (created on first use) and returns the
  // logits of every appended position ([n, vocab]) when `all_logits`, else
  // of the last one ([vocab]). `stats`, when given, accumulates the routing
  // statistics of every step.
  absl::StatusOr<std::vector<float>> Append(SequenceId id, absl::Span<const int32_t> tokens,
                                            bool all_logits, StepRoutingStats* stats = nullptr);
  // Number of tokens sequence `id` holds.
  int64_t Length(SequenceId id) const;
  // Frees the sequence's cache blocks.
  void Release(SequenceId id);

  const KvBlockAllocator& allocator() const { return kv_cache_->allocator(); }

 private:
  SequenceRunner(Backend* backend, const ModelConfig& config, const SequenceRunnerOptions& options,
                 std::unique_ptr<KvCache> kv_cache);

  Backend* backend_;
  ModelConfig config_;
  SequenceRunnerOptions options_;
  std::unique_ptr<KvCache> kv_cache_;
  KvBlockAllocator& allocator_;  // kv_cache_'s
  struct Entry {
    int64_t length = 0;
    GroupLoads group_loads;
  };
  std::unordered_map<SequenceId, Entry> sequences_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_SEQUENCE_RUNNER_H_
