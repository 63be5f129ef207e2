// Checks a GenerateRequest and turns it into the engine's GenerationRequest.
// Every out-of-range field is INVALID_ARGUMENT with a message that starts with
// the field's name (e.g. "sampling.top_p: must be in (0, 1], found 1.5"). Runs
// on the gRPC thread: it only tokenizes and checks, it never touches the engine.
#ifndef SWITCHSERVE_SERVER_REQUEST_VALIDATION_H_
#define SWITCHSERVE_SERVER_REQUEST_VALIDATION_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/runtime/request.h"
#include "engine/text/tokenizer.h"
#include "switchserve/v1/generation.pb.h"

namespace switchserve {

// The repetition penalty's range: far from 0 and infinity, so that a penalised
// logit of any plausible size stays finite.
inline constexpr float kMinRepetitionPenalty = 0.01f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;

// The floating-point sampling fields. Each range is checked on the value as
// the client sent it: a gRPC request's float, or a double (an HTTP request's
// JSON number, generate's flags) before it is narrowed to the engine's float.
// Narrowed first, a number just outside a range rounded onto its bound and
// passed (top_p 1.00000001 as 1, temperature -1e-50 as -0), and one inside
// rounded past it and failed, quoting a value the client never sent (top_p
// 1e-50 as 0).
enum class SamplingFloat {
  kTemperature,
  kTopP,
  kMinP,
  kRepetitionPenalty,
  kPresencePenalty,
  kFrequencyPenalty,
  kLogitBias
};

// INVALID_ARGUMENT "<name>: must be ..., found <value>" unless `value` lies in
// the field's range (temperature: [0, the largest float]; top_p: (0, 1];
// min_p: [0, 1]; repetition_penalty: [0.01, 100]; presence_penalty and
// frequency_penalty: [-2, 2]; a logit_bias value: [-100, 100]).
absl::Status CheckSamplingFloat(SamplingFloat field, std::string_view name, float value);
absl::Status CheckSamplingFloat(SamplingFloat field, std::string_view name, double value);

// A double that CheckSamplingFloat accepted, as the engine's float on the same
// side of the range's bounds: the nearest float, or the smallest positive one
// for a positive value that rounds to 0 (top_p 1e-50; a temperature of 1e-50
// samples, it is not greedy).
float NarrowSamplingFloat(double value);

struct RequestLimits {
  int vocab_size = 0;
  int context_length = 0;            // prompt + max_new_tokens must fit
  int default_max_new_tokens = 256;  // when unset (capped by the context)
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int max_stop_token_ids = kMaxStopTokenIds;
  int max_logprobs = 20;
  int max_logit_bias = kMaxLogitBias;
  int max_bad_words = kMaxBadWords;
  int max_bad_word_bytes = 256;
  bool priority_scheduling = false;  // --scheduling-policy priority: `priority` may be set
  int max_cache_salt_bytes = 1024;
};

// Fills everything except arrival, deadline and sink.
absl::StatusOr<GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_REQUEST_VALIDATION_H_
