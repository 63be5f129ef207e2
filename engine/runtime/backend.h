// The interface between the engine and the hardware: one Forward call runs one
// engine step, a ragged batch of sequences each with a chunk of new tokens (a
// prefill chunk or a single decode token) at its own position, over the paged
// KV cache. The CPU backend (kernels/cpu/cpu_backend.h) and the CUDA backend
// (kernels/) implement it.
//
// A backend never decides who runs: the caller builds the StepInput, owns the
// block accounting (KvBlockAllocator) and passes each sequence's block table.
// Not thread-safe: one thread calls Forward at a time.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_BACKEND_H_
#define SWITCHSERVE_ENGINE_RUNTIME_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/moe/routing.h"
#include "engine/moe/routing_stats.h"

namespace switchserve {

enum class LogitsMode { kNone, kLast, kAll };

struct SequenceChunk {
  std::vector<int32_t> tokens;  // the new tokens, at positions start_pos...
  int32_t start_pos = 0;        // tokens before it are already in the cache
  // Block ids covering positions [0, start_pos + tokens.size()); not owned.
  const std::vector<int32_t>* block_table = nullptr;
  LogitsMode logits = LogitsMode::kLast;
  bool collect_routing = false;  // record routing for the rows returned
};

struct StepInput {
  std::vector<SequenceChunk> chunks;
};

struct StepOutput {
  int32_t vocab_size = 0;
  std::vector<float> logits;          // [rows, vocab_size]
  std::vector<int32_t> row_chunk;     // chunk index of each row
  std::vector<int32_t> row_position;  // absolute position of each row
  std::vector<TokenRouting> routing;  // per row, when the chunk collected it
  StepRoutingStats stats;             // every router, this step
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  // Allocates storage for `num_blocks` KV blocks of `block_size` tokens.
  // Called once, before Forward.
  virtual absl::Status InitKvCache(int64_t num_blocks, int block_size) = 0;
  // Bytes of cache storage per token in this backend's element type.
  virtual int64_t KvBytesPerToken() const = 0;
  // Runs one step. Appends each chunk's K/V to the cache, fills `out`.
  // INVALID_ARGUMENT for malformed input (token outside the vocabulary,
  // position past max_seq_len, block table too short); the cache is then
  // unchanged for every sequence of the step.
  virtual absl::Status Forward(const StepInput& input, StepOutput* out) = 0;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_BACKEND_H_
