// The OpenAI-compatible completions API as data: parsing a /v1/completions
// body into switchserve.v1 GenerateRequests (then checked by the same
// ValidateGenerateRequest as gRPC calls), and writing responses, stream
// chunks and errors in OpenAI's JSON shapes. Pure functions; no I/O.
//
// docs/serving.md ("OpenAI-compatible HTTP API") lists every field: which
// are supported, which are refused (400 naming the field) and the defaults.
#ifndef SWITCHSERVE_SERVER_HTTP_OPENAI_PROTOCOL_H_
#define SWITCHSERVE_SERVER_HTTP_OPENAI_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/runtime/request.h"
#include "engine/text/tokenizer.h"
#include "nlohmann/json.hpp"
#include "switchserve/v1/generation.pb.h"

namespace switchserve {

// OpenAI's default for /v1/completions (vLLM's too), not gRPC's 256.
inline constexpr int kDefaultMaxTokens = 16;

// The most choices one prompt may ask for (`n`), as OpenAI's API allows.
inline constexpr int kMaxChoicesPerPrompt = 128;

// A parsed /v1/completions request: one GenerateRequest per prompt (same
// sampling for all), not yet validated.
struct CompletionRequest {
  std::string model;  // as sent; empty when absent
  std::vector<v1::GenerateRequest> prompts;
  // Choices per prompt, each sampled on its own (`n`; `best_of`, if given,
  // must equal it). Choice j of prompt i is the response's choice i * n + j.
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM's), with include_usage: every
  // event carries its choice's usage so far.
  bool continuous_usage = false;
  std::optional<int> logprobs;  // unset: no logprobs in the response
  // vLLM's return_tokens_as_token_ids: the logprobs object names each token
  // "token_id:N" (distinct keys for tokens that spell the same text).
  bool tokens_as_ids = false;
  // vLLM's return_token_ids: each choice carries `prompt_token_ids` (a
  // stream: in the choice's first event) and `token_ids`, its generated ids
  // (a stream: each event's).
  bool return_token_ids = false;
  // Each choice's text (and logprobs) starts with its prompt's.
  bool echo = false;
  // "max_tokens": 0 with echo: the prompt alone (its logprobs), as vLLM
  // answers it. The engine generates one token, which the response leaves
  // out; `prompts` ask for that one.
  bool echo_only = false;
  int32_t priority = 0;  // vLLM's `priority`: lower is scheduled first
  // vLLM's `truncate_prompt_tokens`: each prompt's last this many tokens
  // (-1: as many as fit beside max_tokens).
  std::optional<int32_t> truncate_prompt_tokens;
  // vLLM's `cache_salt`: the prefix cache shared only with the same salt.
  std::optional<std::string> cache_salt;
  // vLLM's `prompt_logprobs`: each choice's `prompt_logprobs`, every prompt
  // token's logprob and rank with this many alternatives (unset for a
  // stream, which may send 0 and gets nothing).
  // `prompts` ask for it, or else for `logprobs` with echo.
  std::optional<int> prompt_logprobs;
};

// INVALID_ARGUMENT with a message "<param>: <problem>" for anything
// malformed, refused or unknown. `vocab_size` (the model's) is named in the
// refusal of a token id past int32, as the validation names it for the
// others.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, int vocab_size);

// A parsed POST /tokenize request (vLLM's): the text of `prompt`, encoded
// as /v1/completions encodes a prompt.
struct TokenizeRequest {
  std::string model;  // as sent; empty when absent
  std::string prompt;
  bool return_token_strs = false;  // also each token's text (`token_strs`)
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body);

// A parsed POST /detokenize request (vLLM's): `tokens`, ids in the
// vocabulary.
struct DetokenizeRequest {
  std::string model;  // as sent; empty when absent
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body, int vocab_size);

// A name the client sent (an unknown field or option, a model's name), as an
// error message shows it: at most 64 bytes, cut at a UTF-8 character
// boundary, "..." after a cut. A message never echoes a long name back whole.
std::string ShownName(std::string_view name);

// Turns a ValidateGenerateRequest error into the API's terms: the field
// (`sampling.max_new_tokens`, `text`, ...) becomes the request parameter
// (`max_tokens`, `prompt`, ...), with `prompt[i]` for the i-th of several
// prompts. Other statuses pass unchanged.
absl::Status ToApiError(const absl::Status& status, int prompt_index, int prompt_count);

// An error response: the HTTP status for `status`'s code and the body
// {"error": {"message", "type", "param", "code"}}, `param` taken from a
// message of the form "<param>: ...". OK is not an error.
struct ApiError {
  int http_status = 500;
  nlohmann::json body;
};
ApiError MakeApiError(const absl::Status& status);
int HttpStatusFor(absl::StatusCode code);

// "stop" (stop string or token, EOS) or "length".
const char* OpenAiFinishReason(FinishReason reason);

// A token as the logprobs object names it: its text (Tokenizer::PieceBytes),
// or "bytes:\xNN..." when those bytes are no valid UTF-8 on their own;
// "token_id:N" when `as_id`.
std::string TokenString(const Tokenizer& tokenizer, int32_t id, bool as_id = false);

// How far a choice's text has come, for the next token's `text_offset`: the
// characters of its tokens so far, and the bytes of a character they have
// begun and not ended (which a later token completes).
struct TextOffset {
  int64_t characters = 0;
  std::string pending;
  // Some token (of the prompt too) has spelled text: a SentencePiece piece's
  // leading space is in the text from then on (PromptSpellsText).
  bool text_started = false;
};

// Whether a choice's text ends with the tokens given to LogprobsObject.
enum class TextEnd {
  kOpen,       // more tokens may follow (a stream event before the last)
  kAfterLast,  // the last token's bytes are in the text's count (max_tokens; a stop string,
               // whose characters the offsets count though the text leaves them out)
  kBeforeLast  // the text leaves the last token out: the model's EOS, a stop_token_ids token
};

// How the text of a choice that `reason` finished ends, `last_token` its last
// token (the engine checks EOS, then stop_token_ids, before the text), the
// request's stop_token_ids and include_stop_str_in_output given.
TextEnd TextEndOf(FinishReason reason, int32_t last_token,
                  const std::vector<int32_t>& stop_token_ids, bool include_stop);

// The legacy completions `logprobs` object of some generated tokens (each
// one's alternatives most likely first; of alternatives that spell the same
// text, the most likely); `text_offset` counts characters from `offset`,
// which is advanced past the tokens. A token that spells nothing starts where
// the next token that spells something starts, or, past the last, where the
// text ends: after a character the bytes before it began, if the text ends
// there or the next token breaks it (then a U+FFFD), at it if the next token
// completes it; when neither comes with `tokens` and `end` is kOpen, at it.
// `tokens_as_ids`: see CompletionRequest.
// `first_unscored`: the first token is a prompt's first (echo), which
// nothing predicts: its logprob and alternatives are null.
nlohmann::ordered_json LogprobsObject(const Tokenizer& tokenizer,
                                      const std::vector<GeneratedTokenInfo>& tokens, int top_n,
                                      bool tokens_as_ids, TextOffset* offset,
                                      TextEnd end = TextEnd::kOpen, bool first_unscored = false);

// vLLM's `prompt_logprobs` of a choice whose prompt's tokens after the first
// are `tokens`: null for the first (nothing predicts it), then for each of
// `tokens` an object keyed by token id:
// the prompt token first, then the `top_n` most likely (a prompt token among
// them keeps the first place, with its rank in the list), each
// {"logprob", "rank", "decoded_token"}.
// `decoded_token` is TokenString's.
nlohmann::ordered_json PromptLogprobsObject(const Tokenizer& tokenizer,
                                            const std::vector<GeneratedTokenInfo>& tokens,
                                            int top_n, bool tokens_as_ids);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_OPENAI_PROTOCOL_H_
