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

absl::Status FakeBackend::Forward(const StepInput& input, StepOutput* out) {
  if (const int delay = step_delay_ms_.load(); delay > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  int64_t tokens = 0;
  for (const SequenceChunk& chunk : input.chunks) {
    const int64_t end = chunk.start_pos + static_cast<int64_t>(chunk.tokens.size());
    if (chunk.block_table == nullptr ||
        static_cast<int64_t>(chunk.block_table->size()) * block_size_ < end) {
      return absl::InvalidArgumentError("block table too short");
    }
    if (end > max_seq_len_) return absl::InvalidArgumentError("position past max_seq_len");
    for (int32_t t : chunk.tokens) {
      if (t < 0 || t >= vocab_size_) return absl::InvalidArgumentError(absl::StrCat("token ", t));
    }
    tokens += static_cast<int64_t>(chunk.tokens.size());
  }
  out->vocab_size = vocab_size_;
  out->logits.clear();
  out->row_chunk.clear();
  out->row_position.clear();
  out->routing.clear();
  for (size_t c = 0; c < input.chunks.size(); ++c) {
    const SequenceChunk& chunk = input.chunks[c];
    const auto& table = *chunk.block_table;
    auto slot = [&](int64_t pos) {
      return table[pos / block_size_] * block_size_ + pos % block_size_;
    };
    for (size_t i = 0; i < chunk.tokens.size(); ++i)
      cache_[slot(chunk.start_pos + i)] = chunk.tokens[i];
    const int64_t end = chunk.start_pos + static_cast<int64_t>(chunk.tokens.size());
    if (chunk.logits == LogitsMode::kNone) continue;
    const int64_t first_row = chunk.logits == LogitsMode::kAll ? chunk.start_pos : end - 1;
    for (int64_t pos = first_row; pos < end; ++pos) {
      // FNV-1a over the sequence as the cache holds it.
      uint64_t h = 1469598103934665603ULL;
      for (int64_t p = 0; p <= pos; ++p) {
        h = (h ^ static_cast<uint64_t>(cache_[slot(p)] + 1)) * 1099511628211ULL;
      }
      const int32_t peak = 32 + static_cast<int32_t>(h % 95);  // printable ASCII
      for (int v = 0; v < vocab_size_; ++v) {
        const int32_t distance = std::abs(v - peak);
        out->logits.push_back(v == peak ? 4.0f : 2.0f - 0.1f * static_cast<float>(distance % 20));
      }
      out->row_chunk.push_back(static_cast<int32_t>(c));
      out->row_position.push_back(static_cast<int32_t>(pos));
      if (chunk.collect_routing) {
        TokenRouting routing;
        routing.choices.push_back({static_cast<int32_t>(h % 4), 0.5f, RouteFate::kKept});
        out->routing.push_back(routing);
      } else {
        out->routing.emplace_back();
      }
    }
  }
  int prev = max_sequences_.load();
  while (static_cast<int>(input.chunks.size()) > prev &&
         !max_sequences_.compare_exchange_weak(prev, static_cast<int>(input.chunks.size()))) {
  }
  int64_t prev_tokens = max_tokens_.load();
  while (tokens > prev_tokens && !max_tokens_.compare_exchange_weak(prev_tokens, tokens)) {
  }
  ++steps_;
  return absl::OkStatus();
}

}  // namespace switchserve::testing
