// Whole-engine runs for the isolation tests: a batch of requests through a
// fresh GenerationEngine on a fresh backend, with what every step did
// (preemptions, drops) summed, and the full-pass logprobs `score` computes
// for a request's tokens.
#ifndef SWITCHSERVE_TESTS_UTIL_ENGINE_RUNS_H_
#define SWITCHSERVE_TESTS_UTIL_ENGINE_RUNS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/request.h"
#include "tests/util/backends_under_test.h"

namespace switchserve::testing {

struct EngineRunConfig {
  DispatchConfig dispatch;
  int64_t max_batch_tokens = 2048;
  int max_running_requests = 64;
  int block_size = 16;
  int64_t kv_cache_tokens = 4096;  // cache capacity
  bool prefix_caching = false;     // KvCacheOptions::prefix_caching
};

struct TestRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
};

struct RequestOutcome {
  absl::Status status;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<GeneratedTokenInfo> tokens;
  std::vector<GeneratedTokenInfo> prompt_logprobs;  // with SamplingParams::prompt_logprobs
  int cached_prompt_tokens = 0;                     // GenerationUpdate::cached_prompt_tokens
};

// What the run's steps did, summed over steps.
struct EngineRunTotals {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prefill_tokens = 0;
  int max_sequences_per_step = 0;
  int64_t dropped = 0;   // assignments, every router
  int64_t rerouted = 0;  // assignments, every router
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
};

// Submits every request, in order, before the engine starts (so they arrive
// in that order and share steps), and waits for all of them.
std::vector<RequestOutcome> RunEngine(const BackendUnderTest& backend, const Model& model,
                                      const EngineRunConfig& config,
                                      const std::vector<TestRequest>& requests,
                                      EngineRunTotals* totals = nullptr);

// The logits `switchserve score` computes for `tokens` (one SequenceRunner
// pass, all logits, the backend's dispatch), as [tokens, vocab].
std::vector<float> FullPassLogits(const BackendUnderTest& backend, const Model& model,
                                  const DispatchConfig& dispatch,
                                  const std::vector<int32_t>& tokens);

// The routing of every position of `tokens` run as one sequence in one
// step (one TokenRouting per position, RouterLayout order).
std::vector<TokenRouting> PromptRouting(const BackendUnderTest& backend, const Model& model,
                                        const DispatchConfig& dispatch,
                                        const std::vector<int32_t>& tokens);

// Counts of one request's generated tokens' routing choices by fate.
struct FateCounts {
  int64_t kept = 0, rerouted = 0, dropped = 0;
  bool operator==(const FateCounts&) const = default;
};
FateCounts CountFates(const std::vector<GeneratedTokenInfo>& tokens);

// The bits of `f`.
uint32_t Bits(float f);

// Token ids, logprob bits, alternatives and routing of two lists of tokens,
// bit for bit; "" when equal, else where they first differ.
std::string FirstDifference(const std::vector<GeneratedTokenInfo>& a,
                            const std::vector<GeneratedTokenInfo>& b);
// The same of two runs of one request: its generated tokens, then its
// prompt's logprobs.
std::string FirstDifference(const RequestOutcome& a, const RequestOutcome& b);

// Bytes of `text` as byte-tokenizer ids.
std::vector<int32_t> ByteTokens(const std::string& text);

// The built-in model (models/default), loaded once per process; a load
// failure fails the test that asked first.
const Model& DefaultModel();

// A greedy request for `text` (byte tokens) that ignores EOS and returns each
// generated token's logprob and routing: the request whose output the
// isolation tests compare alone and among neighbours.
TestRequest GreedyRoutedRequest(const std::string& text, int max_new_tokens);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_ENGINE_RUNS_H_
