// Checks a GenerateRequest and turns it into the engine's GenerationRequest.
// Every out-of-range field is INVALID_ARGUMENT with a message that starts with
// the field's name (e.g. "sampling.top_p: must be in (0, 1], found 1.5"). Runs
// on the gRPC thread: it only tokenizes and checks, it never touches the engine.
#ifndef SWITCHSERVE_SERVER_REQUEST_VALIDATION_H_
#define SWITCHSERVE_SERVER_REQUEST_VALIDATION_H_

#include "absl/status/statusor.h"
#include "engine/runtime/request.h"
#include "engine/text/tokenizer.h"
#include "switchserve/v1/generation.pb.h"

namespace switchserve {

// The repetition penalty's range: far from 0 and infinity, so that a penalised
// logit of any plausible size stays finite.
inline constexpr float kMinRepetitionPenalty = 0.01f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;

struct RequestLimits {
  int vocab_size = 0;
  int context_length = 0;            // prompt + max_new_tokens must fit
  int default_max_new_tokens = 256;  // when unset (capped by the context)
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int max_stop_token_ids = 64;
  int max_logprobs = 20;
};

// Fills everything except arrival, deadline and sink.
absl::StatusOr<GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_REQUEST_VALIDATION_H_
