// A Backend for scheduler and server tests: no tensors, but an honest model of
// the paged KV cache. Every token written goes to the cache slot its block
// table names; the logits of a row are a deterministic function of all tokens
// the sequence holds up to that row, read back through the block table. A
// scheduler that loses, reorders or overwrites cached tokens changes the
// output, so "same tokens alone and in a crowded batch" is a real check.
// Samples with the host sampler, as the CPU backend does.
#ifndef SWITCHSERVE_TESTS_UTIL_FAKE_BACKEND_H_
#define SWITCHSERVE_TESTS_UTIL_FAKE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"

namespace switchserve::testing {

class FakeBackend : public Backend {
 public:
  // Logits over `vocab_size` tokens; sequences up to `max_seq_len` positions.
  FakeBackend(int vocab_size, int max_seq_len);

  std::string_view name() const override { return "fake"; }
  absl::Status InitKvCache(int64_t num_blocks, int block_size) override;
  DType kv_cache_dtype() const override { return DType::kF32; }
  int64_t KvBytesPerToken() const override { return 8; }
  absl::Status Forward(const StepBatch& batch, StepOutput* out) override;

  // Largest number of sequences / tokens seen in one step.
  int max_sequences_per_step() const { return max_sequences_.load(); }
  int64_t max_tokens_per_step() const { return max_tokens_.load(); }
  int64_t steps() const { return steps_.load(); }
  // Sleep this long in every Forward (to keep requests in flight).
  void set_step_delay_ms(int ms) { step_delay_ms_ = ms; }

 private:
  int vocab_size_;
  int max_seq_len_;
  int block_size_ = 0;
  std::vector<int32_t> cache_;  // token id per slot, -1 when never written
  std::atomic<int> max_sequences_{0};
  std::atomic<int64_t> max_tokens_{0};
  std::atomic<int64_t> steps_{0};
  std::atomic<int> step_delay_ms_{0};
};

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_FAKE_BACKEND_H_
