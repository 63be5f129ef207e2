// A Generate call's message: arbitrary bytes parsed as a GenerateRequest
// (server/wire_format.h) and validated (server/request_validation.h). What
// validation accepts fits the context and keeps every sampling value in its
// range; sampling with it from arbitrary logits (NaN and infinities
// included: the input's bytes as floats) gives a token of the vocabulary,
// allowed and not banned while any such id has a usable logit, and no NaN.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/runtime/sampler.h"
#include "engine/text/tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/request_validation.h"
#include "server/wire_format.h"
#include "switchserve/v1/generation.pb.h"
#include "tests/fuzz/fuzz_check.h"

// protobuf logs every string field with invalid UTF-8 it parses; the
// parse error is what the target checks.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchserve;
  static const auto* const tokenizer = CreateByteTokenizer().release();
  grpc::Slice slice(data, size);
  const grpc::ByteBuffer buffer(&slice, 1);
  v1::GenerateRequest message;
  if (!ParseMessage(buffer, &message).ok()) return 0;
  RequestLimits limits;
  limits.vocab_size = 260;
  limits.context_length = 64;
  absl::StatusOr<GenerationRequest> request = ValidateGenerateRequest(message, *tokenizer, limits);
  if (!request.ok()) {
    FUZZ_CHECK(request.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const SamplingParams& p = request->sampling;
  const int prompt = static_cast<int>(request->prompt.size());
  FUZZ_CHECK(prompt >= 1 && p.max_new_tokens >= 1 &&
             prompt + p.max_new_tokens <= limits.context_length);
  for (int32_t id : request->prompt) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  FUZZ_CHECK(std::isfinite(p.temperature) && p.temperature >= 0);
  FUZZ_CHECK(p.top_p > 0 && p.top_p <= 1 && p.min_p >= 0 && p.min_p <= 1 && p.top_k >= 0);
  FUZZ_CHECK(p.repetition_penalty >= kMinRepetitionPenalty &&
             p.repetition_penalty <= kMaxRepetitionPenalty);
  FUZZ_CHECK(p.logprobs >= 0 && p.logprobs <= limits.max_logprobs);
  FUZZ_CHECK(p.presence_penalty >= -2 && p.presence_penalty <= 2 && p.frequency_penalty >= -2 &&
             p.frequency_penalty <= 2);
  FUZZ_CHECK(p.min_tokens >= 0 && p.min_tokens <= p.max_new_tokens);
  FUZZ_CHECK(static_cast<int>(p.logit_bias.size()) <= limits.max_logit_bias);
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto& [id, bias] = p.logit_bias[i];
    FUZZ_CHECK(id >= 0 && id < limits.vocab_size && bias >= -100 && bias <= 100);
    FUZZ_CHECK(i == 0 || p.logit_bias[i - 1].first < id);
  }
  FUZZ_CHECK(static_cast<int>(p.bad_words_ids.size()) <= 2 * limits.max_bad_words);
  for (const std::vector<int32_t>& word : p.bad_words_ids) {
    FUZZ_CHECK(!word.empty());
    for (int32_t id : word) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  }
  for (size_t i = 0; i < p.allowed_token_ids.size(); ++i) {
    const int32_t id = p.allowed_token_ids[i];
    FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
    FUZZ_CHECK(i == 0 || p.allowed_token_ids[i - 1] < id);
  }

  // Logits: the input's bytes as floats, whatever they encode.
  std::vector<float> logits(limits.vocab_size, 0.0f);
  for (size_t i = 0; i < logits.size() && 4 * (i + 1) <= size; ++i) {
    std::memcpy(&logits[i], data + 4 * i, sizeof(float));
  }
  SamplerRng rng(p.seed);
  const SampleResult result =
      SampleToken(logits, p, request->prompt, static_cast<int64_t>(request->prompt.size() / 2),
                  p.logprobs, rng);
  FUZZ_CHECK(result.token_id >= 0 && result.token_id < limits.vocab_size);
  // An id outside allowed_token_ids, or banned, only when every allowed id
  // the step does not ban scores the lowest finite value too: a logit that
  // is NaN or so negative that a penalty takes it there.
  const int64_t prompt_length = static_cast<int64_t>(request->prompt.size() / 2);
  std::vector<bool> candidate(limits.vocab_size, p.allowed_token_ids.empty());
  for (int32_t id : p.allowed_token_ids) candidate[id] = true;
  for (const auto& [id, bias] :
       SampleBiases(p, absl::MakeConstSpan(request->prompt).subspan(prompt_length))) {
    if (bias == -std::numeric_limits<float>::infinity()) candidate[id] = false;
  }
  if (!candidate[result.token_id]) {
    for (int32_t id = 0; id < limits.vocab_size; ++id) {
      FUZZ_CHECK(!candidate[id] || !(logits[id] > -1e36f));
    }
  }
  FUZZ_CHECK(!std::isnan(result.logprob));
  FUZZ_CHECK(static_cast<int>(result.top_logprobs.size()) == p.logprobs);
  for (size_t i = 0; i < result.top_logprobs.size(); ++i) {
    FUZZ_CHECK(!std::isnan(result.top_logprobs[i].second));
    if (i > 0) FUZZ_CHECK(result.top_logprobs[i - 1].second >= result.top_logprobs[i].second);
  }
  return 0;
}
