// The layout of one engine step: a ragged batch of sequences, each with a
// chunk of new tokens (a prefill chunk or one decode token) at its own
// positions, over the paged KV cache. The runtime (GenerationEngine,
// SequenceRunner) builds it once per step with Clear and Add; a backend reads
// it. Everything a kernel needs is flat: a device backend uploads each array
// in one copy and never re-flattens per-sequence vectors.
//
//   per token [num_tokens], sequence by sequence, in position order:
//     token_ids, positions, token_sequence (the token's sequence index),
//     cache_rows (the cache slot its K/V go to: block * block_size +
//     position % block_size)
//   per sequence [num_sequences] and offsets [num_sequences + 1]:
//     start_positions (tokens of the sequence already in the cache),
//     token_offsets (its tokens are [token_offsets[s], token_offsets[s + 1])),
//     block_offsets (its block table is block_tables[block_offsets[s] ...
//     block_offsets[s + 1]), all of the sequence's blocks, position order),
//     sequences (what the step returns for it: StepSequence)
//
// Plain values; the batch does not own the sampling state its StepSequences
// point to (see SampleRequest).
#ifndef SWITCHSERVE_ENGINE_RUNTIME_STEP_BATCH_H_
#define SWITCHSERVE_ENGINE_RUNTIME_STEP_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model/model_config.h"
#include "engine/runtime/request.h"

namespace switchserve {

class SamplerRng;

// Which of a sequence's new tokens return their full logits.
enum class LogitsMode { kNone, kLast, kAll };

// Sampling of a sequence's next token from the logits of its last new token,
// by the host sampler's rules (engine/runtime/sampler.h).
struct SampleRequest {
  const SamplingParams* params = nullptr;  // null: the step samples nothing
  // The sequence's tokens so far: the prompt, then the generated ones. The
  // repetition penalty applies to all of them, the presence and frequency
  // penalties to those from `prompt_length` on.
  absl::Span<const int32_t> history;
  // The request's generator; the backend advances it by the draws it makes.
  SamplerRng* rng = nullptr;
  int64_t prompt_length = 0;  // <= history.size()
};

// What a sequence carries from step to step under the sequence capacity scope
// (DispatchConfig::CarriesGroupLoads): for every router of the model, in
// RouterLayout order (RouterLayout::ExpertOffset), the per-expert loads of the
// capacity group holding the last position dispatched so far. The owner of
// the sequence keeps it (the engine's request, a SequenceRunner entry) and
// frees it with the sequence; the backend reads and updates it during the
// step. Recompute after preemption needs nothing: it restarts at position 0,
// which opens a group.
struct GroupLoads {
  int64_t next_position = 0;   // positions dispatched so far
  std::vector<int32_t> loads;  // [RouterLayout::total_experts()]; empty before the first step
};

// What the step returns for one sequence, and the per-sequence state the
// backend reads and updates during the step.
struct StepSequence {
  LogitsMode logits = LogitsMode::kNone;  // rows of StepOutput::logits
  // The returned rows and the sampled token carry the token's routing.
  bool collect_routing = false;
  SampleRequest sample;  // set: StepOutput::samples has the sequence's next token
  // The sequence's carried loads (not owned). Null: it carries none, so under
  // a dispatch that carries loads its chunk must open a capacity group
  // (start position % capacity_group == 0); that is enough for a one-step
  // pass over whole sequences.
  GroupLoads* group_loads = nullptr;
};

struct StepBatch {
  int block_size = 0;  // of the KV cache the batch was built for

  // Per token.
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int32_t> token_sequence;
  std::vector<int64_t> cache_rows;  // -1 where the block table does not reach
  // Per sequence.
  std::vector<int32_t> start_positions;
  std::vector<int32_t> token_offsets = {0};
  std::vector<int32_t> block_offsets = {0};
  std::vector<int32_t> block_tables;
  std::vector<StepSequence> sequences;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_sequences() const { return static_cast<int>(sequences.size()); }
  int num_tokens(int s) const { return token_offsets[s + 1] - token_offsets[s]; }
  // Sequence s's block table.
  const int32_t* block_table(int s) const { return block_tables.data() + block_offsets[s]; }
  int num_blocks(int s) const { return block_offsets[s + 1] - block_offsets[s]; }
  // Cache row of position `pos` of sequence s (its block table must reach it).
  int64_t CacheRow(int s, int pos) const {
    return static_cast<int64_t>(block_table(s)[pos / block_size]) * block_size + pos % block_size;
  }

  // Empties the batch for a cache of `block_size`-token blocks.
  void Clear(int block_size);
  // Appends a sequence whose `tokens` take positions start_pos, start_pos + 1,
  // ...; `block_table` is the sequence's whole block table. Returns its
  // StepSequence to fill in.
  StepSequence& Add(absl::Span<const int32_t> tokens, int32_t start_pos,
                    absl::Span<const int32_t> block_table);
};

// What every backend checks before it touches the cache: INVALID_ARGUMENT
// naming the sequence and field for an empty chunk, a token outside
// [0, vocab_size), positions outside [0, max_seq_len), a block table that
// does not cover the chunk or names a block outside [0, num_blocks), a block
// size other than the cache's, or a sample without a generator.
absl::Status ValidateStepBatch(const StepBatch& batch, int vocab_size, int max_seq_len,
                               int64_t num_blocks, int block_size);

// The carried loads of one step, gathered flat for the dispatch: row s
// ([S, width], width = RouterLayout::total_experts()) is sequence s's
// GroupLoads::loads, or zeros where its chunk opens a group. A backend
// gathers before the step (one upload for a device), passes each router its
// columns (engine/moe/expert_dispatch.h, SequenceGroups), and commits after
// it. Under a dispatch that carries no loads (step scope, dropless) every
// call is a no-op and rows() is empty.
class StepGroupLoads {
 public:
  // INVALID_ARGUMENT, naming the sequence, when a chunk that continues a
  // capacity group has no GroupLoads, or loads of another width, or loads
  // that stop at another position than the chunk's start. Changes nothing
  // on error.
  absl::Status Gather(const StepBatch& batch, const DispatchConfig& dispatch, int width);
  // [S, width]; null when the dispatch carries no loads.
  int32_t* rows() { return rows_.empty() ? nullptr : rows_.data(); }
  int width() const { return width_; }
  // Writes each row back to its sequence's GroupLoads (sequences with one),
  // which then ends at the chunk's last position.
  void Commit(const StepBatch& batch) const;

 private:
  std::vector<int32_t> rows_;
  int width_ = 0;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_STEP_BATCH_H_
