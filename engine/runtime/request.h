// A generation request as the engine sees it, and the updates the engine sends
// back while it runs. The server turns a gRPC call into a GenerationRequest
// (after validating every field, see server/request_validation.h); the engine
// never sees protos or raw strings to parse.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_REQUEST_H_
#define SWITCHSERVE_ENGINE_RUNTIME_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/moe/routing.h"

namespace switchserve {

using Clock = std::chrono::steady_clock;

// The most logit_bias entries one request may give (the server's limit;
// the CUDA backend's decode graphs hold that many per sequence).
inline constexpr int kMaxLogitBias = 300;
// The most stop_token_ids one request may give (the server's limit).
inline constexpr int kMaxStopTokenIds = 64;
// The most bad_words one request may give (the server's limit). Each word is
// tokenized at most two ways (SamplingParams::bad_words_ids), each of which
// bans at most one id per sample.
inline constexpr int kMaxBadWords = 64;
// The most logit biases one sample applies: a request's own, the ids
// min_tokens holds back (the model's EOS and the stop ids), and the ids
// bad_words ban.
inline constexpr int kMaxSampleBiases = kMaxLogitBias + 1 + kMaxStopTokenIds + 2 * kMaxBadWords;

// Sampling parameters of one request. Already validated: the engine trusts
// every value (temperature >= 0, 0 < top_p <= 1, ...).
struct SamplingParams {
  int max_new_tokens = 16;          // >= 1
  float temperature = 1.0f;         // 0: greedy
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off
  // Subtracted from the score of each generated token (not the prompt's):
  // presence_penalty once, frequency_penalty times its count. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the score of each listed token: distinct ids in the vocabulary,
  // ascending.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Whether a penalty is on: the sampler then reads the sequence's tokens.
  bool PenalisesHistory() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings, non-empty each
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // The text ends after what ended it: the stop string, or the text of the
  // EOS or stop_token_ids token (vLLM's include_stop_str_in_output).
  bool include_stop_str_in_output = false;
  // The first min_tokens generated tokens cannot end the generation: the ids
  // in min_tokens_ids are not sampled for them (a logit bias of -inf), and a
  // stop string counts only when it ends in the text of a later token.
  // <= max_new_tokens.
  int min_tokens = 0;
  // The ids min_tokens holds back, ascending and distinct: the model's EOS
  // (unless ignore_eos) and stop_token_ids. The engine fills it.
  std::vector<int32_t> min_tokens_ids;
  // Whether min_tokens holds the ids back for the token after `generated`.
  bool HoldsBackStops(int64_t generated) const {
    return generated < min_tokens && !min_tokens_ids.empty();
  }
  // vLLM's bad_words as token sequences, each non-empty: a sample may not
  // complete one, i.e. its last id is banned (a logit bias of -inf) while the
  // generated tokens end with the ids before it (always, for one id). At most
  // 2 * kMaxBadWords.
  std::vector<std::vector<int32_t>> bad_words_ids;
  // Only these ids may be sampled (every other's score is the lowest finite
  // one), ascending and distinct; empty: every id. vLLM's allowed_token_ids.
  std::vector<int32_t> allowed_token_ids;
  int logprobs = 0;  // top-n alternatives per token
  // The sampled token's own logprob also when logprobs == 0 (OpenAI's
  // "logprobs": 0). Without either, the sampler skips the log-softmax and
  // reports a logprob of 0.
  bool sampled_logprob = false;
  bool WantsLogprob() const { return logprobs > 0 || sampled_logprob; }
  bool return_routing = false;
  // The prompt's tokens' logprobs (GenerationUpdate::prompt_logprobs), each
  // with this many alternatives; -1: none. The logits of every prompt
  // position are then computed, not only the last one's.
  int prompt_logprobs = -1;
};

enum class FinishReason { kNone, kLength, kStop, kEos, kCancelled };

// Why a request finished with FinishReason::kCancelled: its caller cancelled
// it (or went away), its deadline passed, or the engine stopped. Servers
// report each as what their client sees (CANCELLED, DEADLINE_EXCEEDED,
// UNAVAILABLE).
enum class CancelCause { kNone, kClient, kDeadline, kShutdown };

// One generated token and, when asked for, its detail.
struct GeneratedTokenInfo {
  int32_t token_id = 0;
  float logprob = 0;  // log-probability under the raw model distribution
  std::vector<std::pair<int32_t, float>> top_logprobs;  // most likely first
  // A prompt token's rank at its position: 1 + the ids with a higher logit
  // (vLLM's); 0 for generated tokens.
  int32_t rank = 0;
  TokenRouting routing;  // of the pass that predicted the token
};

// What a request produced since its previous update. The last update of a
// request has `finished` set; either `status` is OK and `finish_reason` says
// why it ended, or `status` is the engine error that ended it.
struct GenerationUpdate {
  std::string text;  // new text; never ends inside a UTF-8 character
  std::vector<GeneratedTokenInfo> tokens;
  // With SamplingParams::prompt_logprobs >= 0, in the update of the first
  // generated token (or the final one, for a request that ends before it):
  // the prompt's tokens after the first, each one's logprob given the
  // tokens before it and the most likely alternatives there (no routing).
  std::vector<GeneratedTokenInfo> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  // With FinishReason::kStop, what stopped it (vLLM's stop_reason): a
  // stop_token_ids id (stop_token_id >= 0), else one of the stop strings.
  int32_t stop_token_id = -1;
  std::string stop_string;
  CancelCause cancel_cause = CancelCause::kNone;  // set with kCancelled
  absl::Status status;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Prompt tokens taken from the prefix cache rather than computed (the
  // last admission's, after a preemption).
  int cached_prompt_tokens = 0;
  double queue_ms = 0;
  double time_to_first_token_ms = 0;
  double total_ms = 0;
};

// Receives a request's updates. Called on the engine thread, in order, and
// must not block (hand the update to another thread). Exactly one update with
// `finished` set is delivered for every accepted request, also when it is
// cancelled or the engine stops; nothing is delivered after it.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnUpdate(GenerationUpdate update) = 0;
};

// Who sent a request, for logs and metrics; the engine only passes it on (to
// EngineObserver::OnRequestFinished).
struct RequestOrigin {
  std::string request_id;
  std::string protocol;  // "grpc", "http"; empty: in-process (generate, benchmarks)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty, every id in the vocabulary
  SamplingParams sampling;
  Clock::time_point arrival = Clock::now();
  // The request leaves the batch (FinishReason::kCancelled) once this passes.
  std::optional<Clock::time_point> deadline;
  std::shared_ptr<GenerationSink> sink;
  // How the engine groups the request's tokens into updates: the first token
  // alone, as soon as it is sampled (the time to first token never waits),
  // then one update per `stream_interval` tokens, and what is left with the
  // final update. 0: the final update carries everything (a caller that
  // answers only at the end). A streaming server sends a message per update,
  // so a larger interval costs it fewer messages per token. >= 0.
  int stream_interval = 1;
  // Scheduling priority, lower first (vLLM's convention): the engine admits
  // waiting requests by priority, then arrival, and preempts running ones of
  // a lower priority (higher value) for them (Scheduler). 0 for all: FCFS.
  int32_t priority = 0;
  // Prefix caching: the request takes cached blocks only from requests with
  // the same salt, and only those find its own (vLLM's cache_salt: clients
  // that do not share a salt cannot tell from each other's time to first
  // token which prompts the other sent). Empty: the unsalted cache.
  std::string cache_salt;
  RequestOrigin origin;
  // Whether the engine's observer sees the request: the steps it takes part
  // in and its end. The server's own warm-up request is not observed, so
  // that the metrics start from zero; a step with any observed request in it
  // is reported whole.
  bool observed = true;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_REQUEST_H_
