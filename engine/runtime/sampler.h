// Picks the next token of one sequence from its logits: logit bias and
// repetition, presence and frequency penalties, then greedy argmax
// (temperature 0) or temperature, top-k, top-p and min-p filtering and a
// draw from the request's own random generator.
//
// Pure functions of their inputs and the generator state: the same logits,
// parameters, history and seed give the same token, whatever else runs in the
// batch. Thread-compatible; the engine thread owns every SamplerRng.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_SAMPLER_H_
#define SWITCHSERVE_ENGINE_RUNTIME_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/runtime/request.h"

namespace switchserve {

// A request's random generator (splitmix64-seeded xoshiro256**), defined here
// rather than std::mt19937 + std::uniform_real_distribution so the stream of
// draws is fixed by this code, not by the standard library.
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, 1).
  double Uniform();

 private:
  uint64_t s_[4];
};

struct SampleResult {
  int32_t token_id = 0;
  // Of token_id under the raw logits (log-softmax); 0 unless the params or
  // num_logprobs > 0 ask for logprobs.
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // num_logprobs best
  int32_t rank = 0;  // TokenLogprobs: 1 + the ids with a higher logit
};

// The logit biases a sample applies, ascending by id, given the tokens
// generated so far: params.logit_bias, and -inf (in place of a bias the
// request gave the same id) for each of params.min_tokens_ids while
// params.HoldsBackStops(generated.size()), and for the last id of each of
// params.bad_words_ids whose other ids end `generated`. At most
// kMaxSampleBiases.
std::vector<std::pair<int32_t, float>> SampleBiases(const SamplingParams& params,
                                                    absl::Span<const int32_t> generated);

// Samples from `logits` (one row, vocab_size values). `history` holds the
// sequence's tokens so far, its first `prompt_length` the prompt's. The
// scores sampled from are the logits made finite (with
// params.allowed_token_ids, every other id's the lowest finite score), plus
// the biases of SampleBiases (`generated`: the history past prompt_length),
// then the
// repetition penalty on every id of `history` (each distinct id once; the
// lowest finite score unchanged, as -inf would be), then
// score - fma(frequency_penalty, count, presence_penalty) for each id
// generated `count` > 0 times (history from prompt_length on), each step
// made finite again. An id at the lowest finite score (a -inf or NaN logit, a
// -inf bias, one outside allowed_token_ids) is never drawn while another
// scores higher, at any temperature. `num_logprobs` alternatives are returned, most likely
// first; the sampled token's logprob when num_logprobs > 0 or
// params.sampled_logprob, both of the raw logits. Non-finite logits are made
// finite first (NaN: the least likely token; +-inf: the largest finite
// magnitudes), so no comparison or probability sees a NaN.
SampleResult SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         absl::Span<const int32_t> history, int64_t prompt_length, int num_logprobs,
                         SamplerRng& rng);

// `token`'s logprob under `logits` (one row, log-softmax as SampleToken
// reports it), its rank (1 + the ids whose logit, made finite, is higher)
// and the `num_logprobs` most likely tokens', most likely first: how a
// prompt token scores given the logits of the position before it.
SampleResult TokenLogprobs(absl::Span<const float> logits, int32_t token, int num_logprobs);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_SAMPLER_H_
