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
#include "engine/runtime/request.h"

namespace switchserve {

class SamplerRng;

// Which of a sequence's new tokens return their full logits.
enum class LogitsMode { kNone, kLast, kAll };

// Sampling of a sequence's next token from the logits of its last new token,
// by the host sampler's rules (engine/runtime/sampler.h).
struct SampleRequest {
  const SamplingParams* params = nullptr;  // null: the step samples nothing
  // The ids the repetition penalty applies to: the prompt and the tokens
  // generated so far.
  absl::Span<const int32_t> history;
  // The request's generator; the backend advances it by the draws it makes.
  SamplerRng* rng = nullptr;
};

// What the step returns for one sequence. (Per-sequence state that a backend
// reads and updates during the step belongs here too.)
struct StepSequence {
  LogitsMode logits = LogitsMode::kNone;  // rows of StepOutput::logits
  // The returned rows and the sampled token carry the token's routing.
  bool collect_routing = false;
  SampleRequest sample;  // set: StepOutput::samples has the sequence's next token
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

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_STEP_BATCH_H_
