// An HTTP /v1/completions body: arbitrary bytes parsed as a completion request
// (server/http/openai_protocol.h). A refusal is INVALID_ARGUMENT with a short
// message (values and names are shown shortened, never echoed whole) whose
// error response renders as JSON; an accepted body gives at least one prompt,
// each of which the gRPC validation then accepts or refuses with
// INVALID_ARGUMENT. The same bytes as a /tokenize and a /detokenize body:
// refused the same way, or accepted with ids in the vocabulary.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/text/tokenizer.h"
#include "server/http/openai_protocol.h"
#include "server/request_validation.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchserve;
  static const auto* const tokenizer = CreateByteTokenizer().release();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  RequestLimits limits;
  limits.vocab_size = 260;
  limits.context_length = 64;
  const auto check_refusal = [](const absl::Status& status) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(status.message().size() < 512);
    const ApiError error = MakeApiError(status);
    FUZZ_CHECK(error.http_status == 400);
    // The response body renders (every string in it valid UTF-8).
    FUZZ_CHECK(!error.body.dump().empty());
  };
  if (absl::StatusOr<TokenizeRequest> tokenize = ParseTokenizeRequest(body); !tokenize.ok()) {
    check_refusal(tokenize.status());
  }
  if (absl::StatusOr<DetokenizeRequest> detokenize =
          ParseDetokenizeRequest(body, limits.vocab_size);
      !detokenize.ok()) {
    check_refusal(detokenize.status());
  } else {
    for (const int32_t id : detokenize->tokens) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  }
  absl::StatusOr<CompletionRequest> parsed = ParseCompletionRequest(body, limits.vocab_size);
  if (!parsed.ok()) {
    check_refusal(parsed.status());
    return 0;
  }
  FUZZ_CHECK(!parsed->prompts.empty());
  for (const v1::GenerateRequest& prompt : parsed->prompts) {
    auto validated = ValidateGenerateRequest(prompt, *tokenizer, limits);
    FUZZ_CHECK(validated.ok() || validated.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
