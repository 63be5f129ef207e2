#include "tests/util/fake_backend.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"

namespace switchserve::testing {

FakeBackend::FakeBackend(int vocab_size, int max_seq_len)
    : vocab_size_(vocab_size), max_seq_len_(max_seq_len) {}

absl::Status FakeBackend::InitKvCache(int64_t num_blocks, int block_size) {
  block_size_ = block_size;
  cache_.assign(num_blocks * block_size, -1);
  return absl::OkStatus();
}

absl::Status FakeBackend::Forward(const StepBatch& batch, StepOutput* out) {
  if (const int delay = step_delay_ms_.load(); delay > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  const int64_t tokens = batch.num_tokens();
  for (int s = 0; s < batch.num_sequences(); ++s) {
    const int64_t end = batch.start_positions[s] + static_cast<int64_t>(batch.num_tokens(s));
    if (batch.block_size != block_size_ ||
        static_cast<int64_t>(batch.num_blocks(s)) * block_size_ < end) {
      return absl::InvalidArgumentError("block table too short");
    }
    if (end > max_seq_len_) return absl::InvalidArgumentError("position past max_seq_len");
  }
  for (int32_t t : batch.token_ids) {
    if (t < 0 || t >= vocab_size_) return absl::InvalidArgumentError(absl::StrCat("token ", t));
  }
  out->Clear(vocab_size_, {});
  for (int t = 0; t < batch.num_tokens(); ++t) cache_[batch.cache_rows[t]] = batch.token_ids[t];
  std::vector<float> row(vocab_size_);
  for (int s = 0; s < batch.num_sequences(); ++s) {
    const StepSequence& sequence = batch.sequences[s];
    const int32_t* table = batch.block_table(s);
    auto slot = [&](int64_t pos) {
      return table[pos / block_size_] * block_size_ + pos % block_size_;
    };
    const int64_t end = batch.start_positions[s] + static_cast<int64_t>(batch.num_tokens(s));
    const int64_t first_row = sequence.logits == LogitsMode::kAll ? batch.start_positions[s]
                              : sequence.logits == LogitsMode::kLast || sequence.sample.params
                                  ? end - 1
                                  : end;
    for (int64_t pos = first_row; pos < end; ++pos) {
      // FNV-1a over the sequence as the cache holds it.
      uint64_t h = 1469598103934665603ULL;
      for (int64_t p = 0; p <= pos; ++p) {
        h = (h ^ static_cast<uint64_t>(cache_[slot(p)] + 1)) * 1099511628211ULL;
      }
      const int32_t peak = 32 + static_cast<int32_t>(h % 95);  // printable ASCII
      for (int v = 0; v < vocab_size_; ++v) {
        const int32_t distance = std::abs(v - peak);
        row[v] = v == peak ? 4.0f : 2.0f - 0.1f * static_cast<float>(distance % 20);
      }
      TokenRouting routing;
      if (sequence.collect_routing) {
        routing.choices.push_back({static_cast<int32_t>(h % 4), 0.5f, RouteFate::kKept});
      }
      if (sequence.logits != LogitsMode::kNone) {
        out->logits.insert(out->logits.end(), row.begin(), row.end());
        out->row_sequence.push_back(s);
        out->row_position.push_back(static_cast<int32_t>(pos));
        out->routing.push_back(routing);
      }
      if (pos == end - 1 && sequence.sample.params != nullptr) {
        const SampleRequest& request = sequence.sample;
        SampledToken& sampled = out->samples.emplace_back();
        sampled.sequence = s;
        sampled.sample = SampleToken(row, *request.params, request.history, request.prompt_length,
                                     request.params->logprobs, *request.rng);
        sampled.routing = std::move(routing);
      }
    }
  }
  int prev = max_sequences_.load();
  while (batch.num_sequences() > prev &&
         !max_sequences_.compare_exchange_weak(prev, batch.num_sequences())) {
  }
  int64_t prev_tokens = max_tokens_.load();
  while (tokens > prev_tokens && !max_tokens_.compare_exchange_weak(prev_tokens, tokens)) {
  }
  ++steps_;
  return absl::OkStatus();
}

}  // namespace switchserve::testing
