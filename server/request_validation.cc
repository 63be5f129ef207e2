#include "server/request_validation.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/text/detokenizer.h"

namespace switchserve {
namespace {

absl::Status Invalid(std::string_view field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", problem));
}

// The shortest text that reads back as `value` ("1.0000001", "1e-45", "nan";
// a double: "1.00000001"): a message's "found" shows what the client sent,
// not 6 rounded digits.
template <typename T>
std::string FloatText(T value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : absl::StrCat(value);
}

// The ranges compared in the value's own type: a double against 0.01, not
// against 0.01f (a little less).
template <typename T>
absl::Status CheckRange(SamplingFloat field, std::string_view name, T value) {
  switch (field) {
    case SamplingFloat::kTemperature:
      // At most the largest float, which the engine holds (as generate's
      // --temperature).
      if (value >= 0 && value <= std::numeric_limits<float>::max()) return absl::OkStatus();
      if (value > 0 && std::isfinite(value)) {
        // The bound in the value's type: as a float's shortest text,
        // 3.4028235e+38, read back as a double, is past it.
        return Invalid(name,
                       absl::StrCat("must be at most ",
                                    FloatText(static_cast<T>(std::numeric_limits<float>::max())),
                                    " (the largest 32-bit float), found ", FloatText(value)));
      }
      return Invalid(name, absl::StrCat("must be a finite value >= 0, found ", FloatText(value)));
    case SamplingFloat::kTopP:
      if (value > 0 && value <= 1) return absl::OkStatus();
      return Invalid(name, absl::StrCat("must be in (0, 1], found ", FloatText(value)));
    case SamplingFloat::kMinP:
      if (value >= 0 && value <= 1) return absl::OkStatus();
      return Invalid(name, absl::StrCat("must be in [0, 1], found ", FloatText(value)));
    case SamplingFloat::kRepetitionPenalty:
      // Bounded away from 0 and infinity: dividing (or multiplying) a logit
      // by a denormal penalty such as 1e-45 overflows to infinity.
      static_assert(kMinRepetitionPenalty == 0.01f && kMaxRepetitionPenalty == 100.0f);
      if (value >= static_cast<T>(0.01) && value <= static_cast<T>(100)) return absl::OkStatus();
      return Invalid(name, absl::StrCat("must be in [", kMinRepetitionPenalty, ", ",
                                        kMaxRepetitionPenalty, "], found ", FloatText(value)));
    case SamplingFloat::kPresencePenalty:
    case SamplingFloat::kFrequencyPenalty:
      if (value >= -2 && value <= 2) return absl::OkStatus();
      return Invalid(name, absl::StrCat("must be in [-2, 2], found ", FloatText(value)));
    case SamplingFloat::kLogitBias:
      if (value >= -100 && value <= 100) return absl::OkStatus();
      return Invalid(name, absl::StrCat("must be in [-100, 100], found ", FloatText(value)));
  }
  return Invalid(name, "is not a sampling field");
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

// A request's texts (stop strings, bad words) in sampling.`name`: at most
// `max_count` (of `noun`), each 1 to `max_bytes` bytes of valid UTF-8.
absl::Status CheckTexts(const google::protobuf::RepeatedPtrField<std::string>& texts,
                        const char* name, const char* noun, int max_count, int max_bytes) {
  const std::string field = absl::StrCat("sampling.", name);
  if (texts.size() > max_count) {
    return Invalid(field, absl::StrCat("at most ", max_count, " ", noun, ", found ", texts.size()));
  }
  for (int i = 0; i < texts.size(); ++i) {
    const std::string& text = texts[i];
    if (text.empty() || static_cast<int>(text.size()) > max_bytes) {
      return Invalid(field, absl::StrCat(name, "[", i, "] must be 1 to ", max_bytes, " bytes"));
    }
    if (!IsValidUtf8(text)) {
      return Invalid(field, absl::StrCat(name, "[", i, "] is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

// A request's token ids in sampling.`name` (stop_token_ids,
// allowed_token_ids), each in [0, vocab_size), appended to `out`.
absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids, const char* name,
                           int vocab_size, std::vector<int32_t>* out) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(absl::StrCat("sampling.", name),
                     absl::StrCat(name, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ",
                                  vocab_size, ")"));
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  return absl::OkStatus();
}

// vLLM's tokenizations of a bad word: the word without its leading
// whitespace, and " " + that when it gives as many tokens, the first another
// (a word-start token the first misses).
absl::StatusOr<std::vector<std::vector<int32_t>>> BadWordTokenIds(std::string_view word,
                                                                  const Tokenizer& tokenizer) {
  const size_t start = word.find_first_not_of(" \t\n\v\f\r");
  if (start == std::string_view::npos) return absl::InvalidArgumentError("is only whitespace");
  const std::string stripped(word.substr(start));
  auto plain = tokenizer.Encode(stripped);
  if (!plain.ok()) return plain.status();
  if (plain->empty()) return absl::InvalidArgumentError("has no tokens");
  auto spaced = tokenizer.Encode(absl::StrCat(" ", stripped));
  if (!spaced.ok()) return spaced.status();
  std::vector<std::vector<int32_t>> tokenizations;
  const bool word_start = spaced->size() == plain->size() && spaced->front() != plain->front();
  tokenizations.push_back(*std::move(plain));
  if (word_start) tokenizations.push_back(*std::move(spaced));
  return tokenizations;
}

}  // namespace

absl::Status CheckSamplingFloat(SamplingFloat field, std::string_view name, float value) {
  return CheckRange(field, name, value);
}

absl::Status CheckSamplingFloat(SamplingFloat field, std::string_view name, double value) {
  return CheckRange(field, name, value);
}

float NarrowSamplingFloat(double value) {
  // Every range's bounds are floats: rounding to the nearest keeps within them.
  const float narrowed = static_cast<float>(value);
  return value > 0 && narrowed == 0 ? std::numeric_limits<float>::denorm_min() : narrowed;
}

absl::StatusOr<GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                          const Tokenizer& tokenizer,
                                                          const RequestLimits& limits) {
  GenerationRequest out;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return Invalid("text", "the prompt is empty");
      if (!IsValidUtf8(request.text())) return Invalid("text", "is not valid UTF-8");
      auto ids = tokenizer.Encode(request.text());
      if (!ids.ok()) return Invalid("text", std::string(ids.status().message()));
      out.prompt = std::move(*ids);
      if (out.prompt.empty()) return Invalid("text", "the prompt has no tokens");
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return Invalid("token_ids", "the prompt is empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Invalid("token_ids",
                         absl::StrCat("ids[", i, "] = ", ids[i], " is outside the vocabulary [0, ",
                                      limits.vocab_size, ")"));
        }
      }
      out.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return Invalid("prompt", "set either text or token_ids");
  }
  if (request.has_truncate_prompt_tokens()) {
    int keep = request.truncate_prompt_tokens();
    if (keep == -1) {
      // As many as the context holds beside the tokens asked for (unset: the
      // default number, up to half the context), at least one: a longer
      // max_new_tokens is refused below as without truncation.
      const v1::SamplingParams& s = request.sampling();
      const int asked = s.has_max_new_tokens()
                            ? s.max_new_tokens()
                            : std::min(limits.default_max_new_tokens, limits.context_length / 2);
      keep = std::max(1, limits.context_length - std::max(asked, 1));
    } else if (keep < 1) {
      return Invalid("truncate_prompt_tokens",
                     absl::StrCat("must be >= 1, or -1 (as many as fit), found ", keep));
    }
    if (static_cast<int>(out.prompt.size()) > keep) {
      out.prompt.erase(out.prompt.begin(), out.prompt.end() - keep);
    }
  }
  const int prompt_len = static_cast<int>(out.prompt.size());
  if (prompt_len >= limits.context_length) {
    return Invalid(
        request.has_text() ? "text" : "token_ids",
        absl::StrCat("the prompt has ", prompt_len, " tokens; the model's context length is ",
                     limits.context_length, " (prompt + max_new_tokens must fit)"));
  }

  const v1::SamplingParams& s = request.sampling();
  SamplingParams& p = out.sampling;
  const int room = limits.context_length - prompt_len;
  if (s.has_max_new_tokens()) {
    if (s.max_new_tokens() < 1) {
      return Invalid("sampling.max_new_tokens",
                     absl::StrCat("must be >= 1, found ", s.max_new_tokens()));
    }
    if (s.max_new_tokens() > room) {
      return Invalid("sampling.max_new_tokens",
                     absl::StrCat(s.max_new_tokens(), " with a prompt of ", prompt_len,
                                  " tokens exceeds the context length ", limits.context_length,
                                  " (at most ", room, ")"));
    }
    p.max_new_tokens = s.max_new_tokens();
  } else {
    p.max_new_tokens = std::min(limits.default_max_new_tokens, room);
  }
  if (s.has_temperature()) {
    if (absl::Status status = CheckSamplingFloat(SamplingFloat::kTemperature,
                                                 "sampling.temperature", s.temperature());
        !status.ok()) {
      return status;
    }
    p.temperature = s.temperature();
  }
  if (s.top_k() < 0) {
    return Invalid("sampling.top_k", absl::StrCat("must be >= 0 (0: off), found ", s.top_k()));
  }
  p.top_k = s.top_k();
  if (s.has_top_p()) {
    if (absl::Status status = CheckSamplingFloat(SamplingFloat::kTopP, "sampling.top_p", s.top_p());
        !status.ok()) {
      return status;
    }
    p.top_p = s.top_p();
  }
  if (absl::Status status = CheckSamplingFloat(SamplingFloat::kMinP, "sampling.min_p", s.min_p());
      !status.ok()) {
    return status;
  }
  p.min_p = s.min_p();
  if (s.has_repetition_penalty()) {
    if (absl::Status status =
            CheckSamplingFloat(SamplingFloat::kRepetitionPenalty, "sampling.repetition_penalty",
                               s.repetition_penalty());
        !status.ok()) {
      return status;
    }
    p.repetition_penalty = s.repetition_penalty();
  }
  for (const auto& [field, name, value] :
       {std::tuple(SamplingFloat::kPresencePenalty, "sampling.presence_penalty",
                   s.presence_penalty()),
        std::tuple(SamplingFloat::kFrequencyPenalty, "sampling.frequency_penalty",
                   s.frequency_penalty())}) {
    if (absl::Status status = CheckSamplingFloat(field, name, value); !status.ok()) return status;
  }
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  if (s.logit_bias_size() > limits.max_logit_bias) {
    return Invalid("sampling.logit_bias", absl::StrCat("at most ", limits.max_logit_bias,
                                                       " ids, found ", s.logit_bias_size()));
  }
  for (const auto& [id, bias] : s.logit_bias()) {
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(
          "sampling.logit_bias",
          absl::StrCat("id ", id, " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
    if (absl::Status status = CheckSamplingFloat(
            SamplingFloat::kLogitBias, absl::StrCat("sampling.logit_bias[", id, "]"), bias);
        !status.ok()) {
      return status;
    }
    p.logit_bias.emplace_back(id, bias);
  }
  // The map's order is unspecified: ascending ids, the same bits whatever it was.
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  p.seed = s.has_seed() ? s.seed() : RandomSeed();
  if (absl::Status status = CheckTexts(s.stop(), "stop", "stop strings", limits.max_stop_strings,
                                       limits.max_stop_string_bytes);
      !status.ok()) {
    return status;
  }
  p.stop.assign(s.stop().begin(), s.stop().end());
  if (s.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid("sampling.stop_token_ids",
                   absl::StrCat("at most ", limits.max_stop_token_ids, " ids, found ",
                                s.stop_token_ids_size()));
  }
  if (absl::Status status =
          CheckTokenIds(s.stop_token_ids(), "stop_token_ids", limits.vocab_size, &p.stop_token_ids);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckTexts(s.bad_words(), "bad_words", "words", limits.max_bad_words,
                                       limits.max_bad_word_bytes);
      !status.ok()) {
    return status;
  }
  for (int i = 0; i < s.bad_words_size(); ++i) {
    auto ids = BadWordTokenIds(s.bad_words(i), tokenizer);
    if (!ids.ok()) {
      return Invalid("sampling.bad_words",
                     absl::StrCat("bad_words[", i, "] ", ids.status().message()));
    }
    for (std::vector<int32_t>& tokenization : *ids) {
      p.bad_words_ids.push_back(std::move(tokenization));
    }
  }
  if (absl::Status status = CheckTokenIds(s.allowed_token_ids(), "allowed_token_ids",
                                          limits.vocab_size, &p.allowed_token_ids);
      !status.ok()) {
    return status;
  }
  std::sort(p.allowed_token_ids.begin(), p.allowed_token_ids.end());
  p.allowed_token_ids.erase(std::unique(p.allowed_token_ids.begin(), p.allowed_token_ids.end()),
                            p.allowed_token_ids.end());
  p.ignore_eos = s.ignore_eos();
  p.include_stop_str_in_output = s.include_stop_str_in_output();
  if (s.min_tokens() < 0 || s.min_tokens() > p.max_new_tokens) {
    return Invalid("sampling.min_tokens",
                   absl::StrCat("must be in [0, max_new_tokens = ", p.max_new_tokens, "], found ",
                                s.min_tokens()));
  }
  p.min_tokens = s.min_tokens();
  if (request.logprobs() < 0 || request.logprobs() > limits.max_logprobs) {
    return Invalid("logprobs", absl::StrCat("must be in [0, ", limits.max_logprobs, "], found ",
                                            request.logprobs()));
  }
  p.logprobs = request.logprobs();
  p.return_routing = request.return_routing();
  if (request.has_prompt_logprobs()) {
    if (request.prompt_logprobs() < 0 || request.prompt_logprobs() > limits.max_logprobs) {
      return Invalid("prompt_logprobs", absl::StrCat("must be in [0, ", limits.max_logprobs,
                                                     "], found ", request.prompt_logprobs()));
    }
    p.prompt_logprobs = request.prompt_logprobs();
  }
  if (request.priority() != 0 && !limits.priority_scheduling) {
    return Invalid("priority",
                   absl::StrCat("must be 0: this server schedules in arrival order (start it with "
                                "--scheduling-policy priority), found ",
                                request.priority()));
  }
  out.priority = request.priority();
  if (request.has_cache_salt()) {
    const std::string& salt = request.cache_salt();
    if (salt.empty() || static_cast<int>(salt.size()) > limits.max_cache_salt_bytes) {
      return Invalid("cache_salt", absl::StrCat("must be 1 to ", limits.max_cache_salt_bytes,
                                                " bytes, found ", salt.size()));
    }
    out.cache_salt = salt;
  }
  return out;
}

}  // namespace switchserve
