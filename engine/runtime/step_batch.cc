#include "engine/runtime/step_batch.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace switchserve {

void StepBatch::Clear(int new_block_size) {
  block_size = new_block_size;
  token_ids.clear();
  positions.clear();
  token_sequence.clear();
  cache_rows.clear();
  start_positions.clear();
  token_offsets.assign(1, 0);
  block_offsets.assign(1, 0);
  block_tables.clear();
  sequences.clear();
}

StepSequence& StepBatch::Add(absl::Span<const int32_t> tokens, int32_t start_pos,
                             absl::Span<const int32_t> block_table) {
  const int32_t s = num_sequences();
  const int64_t table_tokens = static_cast<int64_t>(block_table.size()) * block_size;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = start_pos + static_cast<int32_t>(i);
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    token_sequence.push_back(s);
    cache_rows.push_back(pos >= 0 && pos < table_tokens
                             ? static_cast<int64_t>(block_table[pos / block_size]) * block_size +
                                   pos % block_size
                             : -1);
  }
  start_positions.push_back(start_pos);
  token_offsets.push_back(static_cast<int32_t>(token_ids.size()));
  block_tables.insert(block_tables.end(), block_table.begin(), block_table.end());
  block_offsets.push_back(static_cast<int32_t>(block_tables.size()));
  return sequences.emplace_back();
}

absl::Status ValidateStepBatch(const StepBatch& batch, int vocab_size, int max_seq_len,
                               int64_t num_blocks, int block_size) {
  const int S = batch.num_sequences();
  if (batch.token_offsets.size() != static_cast<size_t>(S) + 1 ||
      batch.block_offsets.size() != static_cast<size_t>(S) + 1 ||
      batch.start_positions.size() != static_cast<size_t>(S) ||
      batch.token_offsets.back() != batch.num_tokens()) {
    return absl::InvalidArgumentError("step batch: inconsistent offsets (build it with Add)");
  }
  if (S > 0 && batch.block_size != block_size) {
    return absl::InvalidArgumentError(absl::StrCat("step batch: block_size ", batch.block_size,
                                                   ", the KV cache's is ", block_size));
  }
  for (int s = 0; s < S; ++s) {
    // Built only on the error path: validation allocates nothing on success.
    auto where = [s] { return absl::StrCat("sequences[", s, "]"); };
    const int n = batch.num_tokens(s);
    if (n <= 0) return absl::InvalidArgumentError(where() + ".tokens: empty");
    const int32_t* tokens = batch.token_ids.data() + batch.token_offsets[s];
    for (int i = 0; i < n; ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ".tokens[", i, "]: ", tokens[i], " outside vocabulary [0, ", vocab_size, ")"));
      }
    }
    const int64_t start = batch.start_positions[s];
    const int64_t end = start + n;
    if (start < 0 || end > max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": positions [", start, ", ", end,
                                                     ") outside [0, max_seq_len ", max_seq_len,
                                                     ")"));
    }
    const int64_t needed = (end + block_size - 1) / block_size;
    if (batch.num_blocks(s) < needed) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ".block_table: ", batch.num_blocks(s),
                                                     " blocks, positions up to ", end, " need ",
                                                     needed));
    }
    for (int64_t b = 0; b < needed; ++b) {
      const int32_t id = batch.block_table(s)[b];
      if (id < 0 || id >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(where(), ".block_table[", b, "]: block ", id,
                                                       " outside [0, ", num_blocks, ")"));
      }
    }
    const SampleRequest& sample = batch.sequences[s].sample;
    if (sample.params != nullptr && sample.rng == nullptr) {
      return absl::InvalidArgumentError(where() + ".sample: no generator");
    }
  }
  return absl::OkStatus();
}

}  // namespace switchserve
