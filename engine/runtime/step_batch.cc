#include "engine/runtime/step_batch.h"

#include <algorithm>
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
    if (sample.params != nullptr &&
        (sample.prompt_length < 0 ||
         sample.prompt_length > static_cast<int64_t>(sample.history.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ".sample: prompt_length ",
                                                     sample.prompt_length, " outside [0, ",
                                                     sample.history.size(), "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepGroupLoads::Gather(const StepBatch& batch, const DispatchConfig& dispatch,
                                    int width) {
  rows_.clear();
  width_ = width;
  if (!dispatch.CarriesGroupLoads() || width == 0) return absl::OkStatus();
  const int S = batch.num_sequences();
  const int group = dispatch.capacity_group;
  for (int s = 0; s < S; ++s) {
    const int32_t start = batch.start_positions[s];
    if (start % group == 0) continue;  // opens a group: nothing carried
    const GroupLoads* carried = batch.sequences[s].group_loads;
    auto where = [&] {
      return absl::StrCat("sequences[", s, "]: the chunk at position ", start,
                          " continues a capacity group of ", group, " positions but ");
    };
    if (carried == nullptr) return absl::InvalidArgumentError(where() + "carries no group loads");
    if (carried->next_position != start) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "its group loads end at position ", carried->next_position));
    }
    if (carried->loads.size() != static_cast<size_t>(width)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "its group loads hold ", carried->loads.size(), " counts, not ", width));
    }
  }
  rows_.assign(static_cast<size_t>(S) * width, 0);
  for (int s = 0; s < S; ++s) {
    const GroupLoads* carried = batch.sequences[s].group_loads;
    if (batch.start_positions[s] % group == 0 || carried == nullptr) continue;
    std::copy(carried->loads.begin(), carried->loads.end(),
              rows_.begin() + static_cast<int64_t>(s) * width);
  }
  return absl::OkStatus();
}

void StepGroupLoads::Commit(const StepBatch& batch) const {
  if (rows_.empty()) return;
  for (int s = 0; s < batch.num_sequences(); ++s) {
    GroupLoads* carried = batch.sequences[s].group_loads;
    if (carried == nullptr) continue;
    const auto row = rows_.begin() + static_cast<int64_t>(s) * width_;
    carried->loads.assign(row, row + width_);
    carried->next_position = batch.start_positions[s] + batch.num_tokens(s);
  }
}

}  // namespace switchserve
