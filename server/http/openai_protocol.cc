#include "server/http/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/model/json_text.h"
#include "engine/text/detokenizer.h"
#include "server/request_validation.h"

namespace switchserve {

std::string ShownName(std::string_view name) {
  constexpr size_t kMaxBytes = 64;
  if (name.size() <= kMaxBytes) return std::string(name);
  size_t cut = kMaxBytes;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(std::string(name.substr(0, cut)), "...");
}

namespace {

using Json = nlohmann::json;

absl::Status Invalid(std::string_view param, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(param), ": ", problem));
}

// Arrays and objects nested deeper than this are refused before the body is
// parsed: rendering one (an error message's "found ...") recurses per level,
// and the parser builds every level it reads (a 4 MB body of "[" took 300 MB
// and 0.7 s of an I/O thread). A request needs three (the body, a list of
// prompts, a prompt's token ids).
constexpr int kMaxJsonDepth = 16;

// "must be <what>, found <the value>", the value shortened (DescribeJson).
absl::Status WrongType(std::string_view param, const char* what, const Json& value) {
  return Invalid(param, absl::StrCat("must be ", what, ", found ", DescribeJson(value)));
}

// Fields a client may send, beyond which every other field is refused.
// Supported: model, prompt, max_tokens, temperature, top_p, n, best_of (= n),
// stream, stream_options, logprobs, stop, seed, user, echo; and vLLM's
// sampling extensions top_k, min_p, repetition_penalty, ignore_eos,
// stop_token_ids, min_tokens, include_stop_str_in_output, bad_words,
// allowed_token_ids, return_tokens_as_token_ids, return_token_ids,
// truncate_prompt_tokens, prompt_logprobs, cache_salt; presence_penalty,
// frequency_penalty, logit_bias. Accepted only at its neutral value: suffix,
// skip_special_tokens (true). Accepted and without effect (no special token
// is ever in the text): spaces_between_special_tokens.
bool Known(const std::string& key) {
  static const char* const kKnown[] = {"model",
                                       "prompt",
                                       "max_tokens",
                                       "temperature",
                                       "top_p",
                                       "n",
                                       "stream",
                                       "stream_options",
                                       "logprobs",
                                       "stop",
                                       "seed",
                                       "user",
                                       "top_k",
                                       "min_p",
                                       "repetition_penalty",
                                       "ignore_eos",
                                       "stop_token_ids",
                                       "min_tokens",
                                       "include_stop_str_in_output",
                                       "bad_words",
                                       "allowed_token_ids",
                                       "return_tokens_as_token_ids",
                                       "return_token_ids",
                                       "echo",
                                       "best_of",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "logit_bias",
                                       "priority",
                                       "truncate_prompt_tokens",
                                       "prompt_logprobs",
                                       "cache_salt",
                                       "skip_special_tokens",
                                       "spaces_between_special_tokens",
                                       "suffix"};
  for (const char* known : kKnown) {
    if (key == known) return true;
  }
  return false;
}

// An integer, also one written as a float (2.0, 1e3) as pydantic's lax mode
// (vLLM) takes it; unset past int64 (1e20, 2^64 - 1), which no parameter
// takes. A float of -2^63 is past it too: the JSON reader gives every integer
// from -2^63 - 1024 to -2^63 - 1 as that double (-2^63 itself is an integer),
// which a refusal would otherwise name as -9223372036854775808.
absl::StatusOr<std::optional<int64_t>> WholeNumber(const Json& value, std::string_view param) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::optional<int64_t>();
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::trunc(d)) {
      if (d <= -0x1p63 || d >= 0x1p63) return std::optional<int64_t>();
      return static_cast<int64_t>(d);
    }
  }
  return WrongType(param, "an integer", value);
}

// A message's "found": the WholeNumber, or past int64 the value as sent.
std::string Found(const std::optional<int64_t>& n, const Json& value) {
  return n.has_value() ? absl::StrCat(*n) : DescribeJson(value);
}

// An integer parameter in [lo, hi]. Any other integer, past int64 too, is
// refused naming the range: "must be in [lo, hi]<note>, found <value>".
absl::StatusOr<int64_t> Integer(const Json& value, std::string_view param, int64_t lo, int64_t hi,
                                const char* note = "") {
  auto n = WholeNumber(value, param);
  if (!n.ok()) return n.status();
  if (!n->has_value() || **n < lo || **n > hi) {
    return Invalid(
        param, absl::StrCat("must be in [", lo, ", ", hi, "]", note, ", found ", Found(*n, value)));
  }
  return **n;
}

absl::StatusOr<double> Number(const Json& value, std::string_view param) {
  if (!value.is_number()) return WrongType(param, "a number", value);
  return value.get<double>();
}

absl::StatusOr<bool> Boolean(const Json& value, std::string_view param) {
  if (!value.is_boolean()) return WrongType(param, "true or false", value);
  return value.get<bool>();
}

// A list of token ids (a prompt, stop_token_ids; its i-th named `entry`[i]
// in a refusal): integers that fit int32, whole floats among them as
// WholeNumber takes them (pydantic's lax mode reads list[int] so too). The
// validation checks them against the vocabulary; one past int32 is refused
// here, with the same message.
absl::StatusOr<v1::TokenIds> TokenIdList(const Json& list, std::string_view param,
                                         const char* entry, int vocab_size) {
  v1::TokenIds ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& id = list[i];
    const auto n = WholeNumber(id, param);
    if (!n.ok()) {
      return Invalid(param,
                     absl::StrCat(entry, "[", i, "] must be an integer, found ", DescribeJson(id)));
    }
    // An id past int32 is outside every vocabulary (those past int64 too).
    if (!n->has_value() || **n < std::numeric_limits<int32_t>::min() ||
        **n > std::numeric_limits<int32_t>::max()) {
      return Invalid(param, absl::StrCat(entry, "[", i, "] = ", DescribeJson(id),
                                         " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    ids.add_ids(static_cast<int32_t>(**n));
  }
  return ids;
}

// `prompt`: a string, a list of token ids, or a list of either (several
// prompts).
absl::Status ParsePrompts(const Json& prompt, int vocab_size,
                          std::vector<v1::GenerateRequest>* out) {
  auto add_text = [&](const Json& text) { out->emplace_back().set_text(text.get<std::string>()); };
  if (prompt.is_string()) {
    add_text(prompt);
    return absl::OkStatus();
  }
  if (!prompt.is_array()) {
    return Invalid("prompt", "must be a string, a list of token ids, or a list of those");
  }
  if (prompt.empty()) return Invalid("prompt", "the list is empty");
  if (prompt[0].is_number()) {
    auto ids = TokenIdList(prompt, "prompt", "ids", vocab_size);
    if (!ids.ok()) return ids.status();
    *out->emplace_back().mutable_token_ids() = std::move(*ids);
    return absl::OkStatus();
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string param = absl::StrCat("prompt[", i, "]");
    if (prompt[i].is_string()) {
      add_text(prompt[i]);
    } else if (prompt[i].is_array()) {
      auto ids = TokenIdList(prompt[i], param, "ids", vocab_size);
      if (!ids.ok()) return ids.status();
      *out->emplace_back().mutable_token_ids() = std::move(*ids);
    } else {
      return Invalid(param, "must be a string or a list of token ids");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& stop, v1::SamplingParams* sampling) {
  if (stop.is_string()) {
    sampling->add_stop(stop.get<std::string>());
    return absl::OkStatus();
  }
  if (!stop.is_array()) return Invalid("stop", "must be a string or a list of strings");
  for (size_t i = 0; i < stop.size(); ++i) {
    if (!stop[i].is_string()) {
      return Invalid("stop",
                     absl::StrCat("stop[", i, "] must be a string, found ", DescribeJson(stop[i])));
    }
    sampling->add_stop(stop[i].get<std::string>());
  }
  return absl::OkStatus();
}

// Sets the sampling fields; every value is range-checked later by
// ValidateGenerateRequest.
absl::Status ParseField(const std::string& key, const Json& value, int vocab_size,
                        CompletionRequest* request, v1::SamplingParams* sampling, int* logprobs,
                        std::optional<int>* best_of) {
  if (key == "model") {
    if (!value.is_string()) return Invalid("model", "must be a string");
    request->model = value.get<std::string>();
  } else if (key == "max_tokens") {
    // 0 is checked against echo once every field is read.
    if (auto zero = WholeNumber(value, key); zero.ok() && *zero == std::optional<int64_t>(0)) {
      request->echo_only = true;
      sampling->set_max_new_tokens(1);
      return absl::OkStatus();
    }
    auto n = Integer(value, key, 1, std::numeric_limits<int32_t>::max());
    if (!n.ok()) return n.status();
    sampling->set_max_new_tokens(static_cast<int32_t>(*n));
  } else if (key == "temperature" || key == "top_p" || key == "min_p" ||
             key == "repetition_penalty" || key == "presence_penalty" ||
             key == "frequency_penalty") {
    auto x = Number(value, key);
    if (!x.ok()) return x.status();
    // The range is checked on the number as sent, before it becomes the
    // engine's float (request_validation.h).
    const SamplingFloat field = key == "temperature"         ? SamplingFloat::kTemperature
                                : key == "top_p"             ? SamplingFloat::kTopP
                                : key == "min_p"             ? SamplingFloat::kMinP
                                : key == "presence_penalty"  ? SamplingFloat::kPresencePenalty
                                : key == "frequency_penalty" ? SamplingFloat::kFrequencyPenalty
                                                             : SamplingFloat::kRepetitionPenalty;
    if (absl::Status status = CheckSamplingFloat(field, key, *x); !status.ok()) return status;
    const float f = NarrowSamplingFloat(*x);
    if (key == "temperature") sampling->set_temperature(f);
    if (key == "top_p") sampling->set_top_p(f);
    if (key == "min_p") sampling->set_min_p(f);
    if (key == "repetition_penalty") sampling->set_repetition_penalty(f);
    if (key == "presence_penalty") sampling->set_presence_penalty(f);
    if (key == "frequency_penalty") sampling->set_frequency_penalty(f);
  } else if (key == "top_k") {
    // vLLM spells "off" -1; 0 means the same here.
    auto k = Integer(value, key, -1, std::numeric_limits<int32_t>::max(), " (-1 or 0: off)");
    if (!k.ok()) return k.status();
    sampling->set_top_k(*k == -1 ? 0 : static_cast<int32_t>(*k));
  } else if (key == "n") {
    auto n = Integer(value, key, 1, kMaxChoicesPerPrompt);
    if (!n.ok()) return n.status();
    request->n = static_cast<int>(*n);
  } else if (key == "best_of") {
    // Checked against n once every field is read.
    auto n = Integer(value, key, 1, kMaxChoicesPerPrompt);
    if (!n.ok()) return n.status();
    *best_of = static_cast<int>(*n);
  } else if (key == "stream") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    request->stream = *b;
  } else if (key == "stream_options") {
    if (!value.is_object()) return Invalid(key, "must be an object");
    for (const auto& [option, option_value] : value.items()) {
      if (option != "include_usage" && option != "continuous_usage_stats") {
        return Invalid(absl::StrCat("stream_options.", ShownName(option)), "unknown option");
      }
      if (option_value.is_null()) continue;  // null: the default
      auto b = Boolean(option_value, absl::StrCat("stream_options.", option));
      if (!b.ok()) return b.status();
      (option == "include_usage" ? request->include_usage : request->continuous_usage) = *b;
    }
  } else if (key == "logprobs") {
    // The validation's range, named here too: a bound of int32 is none a
    // client can use.
    auto n = Integer(value, key, 0, RequestLimits{}.max_logprobs);
    if (!n.ok()) return n.status();
    *logprobs = static_cast<int>(*n);
    request->logprobs = *logprobs;
  } else if (key == "stop") {
    return ParseStop(value, sampling);
  } else if (key == "seed") {
    // Any integer in [-2^63, 2^64), a negative one taken modulo 2^64.
    if (value.is_number_unsigned()) {
      sampling->set_seed(value.get<uint64_t>());
    } else if (value.is_number_integer()) {
      sampling->set_seed(static_cast<uint64_t>(value.get<int64_t>()));
    } else {
      // A whole float (1e3, 1e19), as Integer takes them. The JSON reader
      // also gives an integer past int64 or uint64 as the nearest double,
      // and every integer from -2^63 - 1024 to -2^63 - 1 as -2^63 itself:
      // that bound is refused, or those seeds would be taken as 2^63.
      const double d = value.is_number_float() ? value.get<double>() : 0.5;
      if (!std::isfinite(d) || d != std::trunc(d)) return WrongType(key, "an integer", value);
      if (d <= -0x1p63 || d >= 0x1p64) {
        return Invalid(key, absl::StrCat("must be in [", std::numeric_limits<int64_t>::min(), ", ",
                                         std::numeric_limits<uint64_t>::max(), "], found ",
                                         DescribeJson(value)));
      }
      sampling->set_seed(d >= 0 ? static_cast<uint64_t>(d)
                                : static_cast<uint64_t>(static_cast<int64_t>(d)));
    }
  } else if (key == "user") {
    if (!value.is_string()) return Invalid(key, "must be a string");
  } else if (key == "ignore_eos") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    sampling->set_ignore_eos(*b);
  } else if (key == "stop_token_ids") {
    if (!value.is_array()) return Invalid(key, "must be a list of token ids");
    auto ids = TokenIdList(value, key, "stop_token_ids", vocab_size);
    if (!ids.ok()) return ids.status();
    sampling->mutable_stop_token_ids()->Add(ids->ids().begin(), ids->ids().end());
  } else if (key == "bad_words") {
    if (!value.is_array()) return WrongType(key, "a list of strings", value);
    for (size_t i = 0; i < value.size(); ++i) {
      if (!value[i].is_string()) {
        return Invalid(key, absl::StrCat("bad_words[", i, "] must be a string, found ",
                                         DescribeJson(value[i])));
      }
      sampling->add_bad_words(value[i].get<std::string>());
    }
  } else if (key == "allowed_token_ids") {
    if (!value.is_array()) return WrongType(key, "a list of token ids", value);
    if (value.empty()) return Invalid(key, "the list is empty (null: every id)");
    auto ids = TokenIdList(value, key, "allowed_token_ids", vocab_size);
    if (!ids.ok()) return ids.status();
    sampling->mutable_allowed_token_ids()->Add(ids->ids().begin(), ids->ids().end());
  } else if (key == "prompt_logprobs") {
    // vLLM's -1 (the whole vocabulary) is past the alternatives served.
    auto n = Integer(value, key, 0, RequestLimits{}.max_logprobs);
    if (!n.ok()) return n.status();
    request->prompt_logprobs = static_cast<int>(*n);
  } else if (key == "truncate_prompt_tokens") {
    // 0 and -1 reach the validation, which refuses 0 (-1: as many as fit).
    auto n = Integer(value, key, -1, std::numeric_limits<int32_t>::max());
    if (!n.ok()) return n.status();
    request->truncate_prompt_tokens = static_cast<int32_t>(*n);
  } else if (key == "include_stop_str_in_output") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    sampling->set_include_stop_str_in_output(*b);
  } else if (key == "min_tokens") {
    auto n = Integer(value, key, 0, std::numeric_limits<int32_t>::max());
    if (!n.ok()) return n.status();
    sampling->set_min_tokens(static_cast<int32_t>(*n));
  } else if (key == "return_tokens_as_token_ids") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    request->tokens_as_ids = *b;
  } else if (key == "return_token_ids") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    request->return_token_ids = *b;
  } else if (key == "echo") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    request->echo = *b;
  } else if (key == "logit_bias") {
    // {"<token id>": bias}: JSON keys are strings.
    if (!value.is_object()) return WrongType(key, "an object of token ids to biases", value);
    for (const auto& [id_text, bias] : value.items()) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(id_text, &id) || id < std::numeric_limits<int32_t>::min() ||
          id > std::numeric_limits<int32_t>::max()) {
        return Invalid(key, absl::StrCat("the key \"", ShownName(id_text),
                                         "\" is no token id in [0, ", vocab_size, ")"));
      }
      if (bias.is_null()) continue;
      const std::string param = absl::StrCat(key, "[", id, "]");
      auto x = Number(bias, param);
      if (!x.ok()) return x.status();
      if (absl::Status status = CheckSamplingFloat(SamplingFloat::kLogitBias, param, *x);
          !status.ok()) {
        return status;
      }
      (*sampling->mutable_logit_bias())[static_cast<int32_t>(id)] = NarrowSamplingFloat(*x);
    }
  } else if (key == "priority") {
    // vLLM's extension; checked against the server's scheduling policy with
    // the rest of the request (request_validation.h).
    auto priority = Integer(value, key, std::numeric_limits<int32_t>::min(),
                            std::numeric_limits<int32_t>::max());
    if (!priority.ok()) return priority.status();
    request->priority = static_cast<int32_t>(*priority);
  } else if (key == "cache_salt") {
    // Its length is checked with the rest of the request.
    if (!value.is_string()) return WrongType(key, "a string", value);
    request->cache_salt = value.get<std::string>();
  } else if (key == "skip_special_tokens") {
    auto b = Boolean(value, key);
    if (!b.ok()) return b.status();
    if (!*b) {
      return Invalid(key,
                     "must be true: special tokens (the tokenizer's control pieces) always "
                     "decode to no text");
    }
  } else if (key == "spaces_between_special_tokens") {
    if (absl::StatusOr<bool> b = Boolean(value, key); !b.ok()) return b.status();
  } else if (key == "suffix") {
    if (!value.is_string() || !value.get<std::string>().empty()) {
      return Invalid(key, "is not supported");
    }
  }
  return absl::OkStatus();
}

// The request parameter a validation field belongs to.
std::string ParamOf(std::string_view field) {
  if (field == "text" || field == "token_ids" || field == "prompt") return "prompt";
  if (field == "sampling.max_new_tokens") return "max_tokens";
  constexpr std::string_view kSampling = "sampling.";
  if (field.substr(0, kSampling.size()) == kSampling) {
    return std::string(field.substr(kSampling.size()));
  }
  return std::string(field);
}

std::string Lower(std::string_view text) { return absl::AsciiStrToLower(std::string(text)); }

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return http_status < 500 ? "invalid_request_error" : "server_error";
  }
}

// Characters (code points) in UTF-8 text.
int64_t CharacterCount(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// The refusal of a body the parser could not read. JSON has no bound on a
// number, but the parser holds one in a double: past the largest (1e400, the
// only way JSON spells an infinity) it fails as on a syntax error. That
// number is refused naming the parameter it was sent for, as gRPC names a
// float field sent as inf; anything else is invalid JSON.
absl::Status UnreadableBody(std::string_view body) {
  // Walks the body to where the parser failed, keeping the parameter
  // (top-level key, and an option's key within `stream_options`).
  class Walk : public nlohmann::json_sax<Json> {
   public:
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return Open(true); }
    bool start_array(std::size_t) override { return Open(false); }
    bool end_object() override { return Close(); }
    bool end_array() override { return Close(); }
    bool key(string_t& key) override {
      if (objects_.size() == 1) {
        param_ = key;
        option_.clear();
      } else if (objects_.size() == 2 && objects_[1]) {
        option_ = key;
      }
      return true;
    }
    bool parse_error(std::size_t, const std::string& token,
                     const nlohmann::detail::exception& error) override {
      overflow_ = error.id == 406 && !param_.empty();  // "number overflow"
      number_ = token;
      return false;
    }
    absl::Status Refusal() const {
      if (!overflow_) return Invalid("body", "is not valid JSON");
      if (!Known(param_)) {
        return Invalid(ShownName(param_),
                       "unrecognized request argument (docs/serving.md lists the supported "
                       "ones)");
      }
      const std::string param = param_ == "stream_options" && !option_.empty()
                                    ? absl::StrCat("stream_options.", ShownName(option_))
                                    : param_;
      constexpr size_t kMaxChars = 60;
      const std::string shown =
          number_.size() > kMaxChars ? absl::StrCat(number_.substr(0, kMaxChars), "...") : number_;
      return Invalid(param, absl::StrCat("is out of range (past the largest double, 1.8e308), "
                                         "found ",
                                         shown));
    }

   private:
    bool Open(bool object) {
      objects_.push_back(object);
      return true;
    }
    bool Close() {
      objects_.pop_back();
      return true;
    }
    std::vector<bool> objects_;  // the open containers: true for an object
    std::string param_, option_, number_;
    bool overflow_ = false;
  } walk;
  Json::sax_parse(body, &walk);
  return walk.Refusal();
}

// A request's body: a JSON object, at most kMaxJsonDepth deep.
absl::StatusOr<Json> BodyObject(std::string_view body) {
  // nlohmann's lexer ends the input at a NUL byte, which JSON text never has.
  if (body.find('\0') != std::string_view::npos) {
    return Invalid("body", "is not valid JSON (a NUL byte)");
  }
  if (NestsDeeperThan(body, kMaxJsonDepth)) {
    return Invalid(
        "body", absl::StrCat("nests arrays and objects more than ", kMaxJsonDepth, " levels deep"));
  }
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return UnreadableBody(body);
  if (!json.is_object()) return Invalid("body", "must be a JSON object");
  return json;
}

absl::Status UnknownField(const std::string& key) {
  return Invalid(ShownName(key),
                 "unrecognized request argument (docs/serving.md lists the supported ones)");
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  auto json = BodyObject(body);
  if (!json.ok()) return json.status();
  TokenizeRequest request;
  bool has_prompt = false;
  for (const auto& [key, value] : json->items()) {
    if (value.is_null()) continue;  // the default
    if (key == "model") {
      if (!value.is_string()) return Invalid("model", "must be a string");
      request.model = value.get<std::string>();
    } else if (key == "prompt") {
      if (!value.is_string()) return WrongType(key, "a string", value);
      request.prompt = value.get<std::string>();
      has_prompt = true;
    } else if (key == "add_special_tokens") {
      auto b = Boolean(value, key);
      if (!b.ok()) return b.status();
      if (*b) {
        return Invalid(key,
                       "must be false: prompts are encoded with no special tokens added (as "
                       "/v1/completions encodes them), found true");
      }
    } else if (key == "return_token_strs") {
      auto b = Boolean(value, key);
      if (!b.ok()) return b.status();
      request.return_token_strs = *b;
    } else {
      return UnknownField(key);
    }
  }
  if (!has_prompt) return Invalid("prompt", "is required");
  return request;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body, int vocab_size) {
  auto json = BodyObject(body);
  if (!json.ok()) return json.status();
  DetokenizeRequest request;
  bool has_tokens = false;
  for (const auto& [key, value] : json->items()) {
    if (value.is_null()) continue;  // the default
    if (key == "model") {
      if (!value.is_string()) return Invalid("model", "must be a string");
      request.model = value.get<std::string>();
    } else if (key == "tokens") {
      if (!value.is_array()) return WrongType(key, "a list of token ids", value);
      auto ids = TokenIdList(value, key, "tokens", vocab_size);
      if (!ids.ok()) return ids.status();
      for (int i = 0; i < ids->ids_size(); ++i) {
        const int32_t id = ids->ids(i);
        if (id < 0 || id >= vocab_size) {
          return Invalid(key, absl::StrCat("tokens[", i, "] = ", id,
                                           " is outside the vocabulary [0, ", vocab_size, ")"));
        }
      }
      request.tokens.assign(ids->ids().begin(), ids->ids().end());
      has_tokens = true;
    } else {
      return UnknownField(key);
    }
  }
  if (!has_tokens) return Invalid("tokens", "is required");
  return request;
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body, int vocab_size) {
  auto parsed = BodyObject(body);
  if (!parsed.ok()) return parsed.status();
  const Json& json = *parsed;
  CompletionRequest request;
  v1::SamplingParams sampling;
  int logprobs = 0;
  std::optional<int> best_of;
  for (const auto& [key, value] : json.items()) {
    if (!Known(key)) return UnknownField(key);
    if (value.is_null() || key == "prompt") continue;  // null: the default
    if (absl::Status status =
            ParseField(key, value, vocab_size, &request, &sampling, &logprobs, &best_of);
        !status.ok()) {
      return status;
    }
  }
  // best_of > n samples more choices and returns the n most likely: not
  // done here (nor by vLLM's current engine).
  if (best_of.has_value() && *best_of != request.n) {
    return Invalid("best_of", absl::StrCat("must equal n (", request.n,
                                           "): returning the best of more samples is not "
                                           "supported, found ",
                                           *best_of));
  }
  if (request.echo_only && !request.echo) {
    return Invalid("max_tokens",
                   "must be in [1, 2147483647], found 0 (0 only with \"echo\": "
                   "true, for the prompt alone)");
  }
  const auto prompt = json.find("prompt");
  if (prompt == json.end() || prompt->is_null()) return Invalid("prompt", "is required");
  if (absl::Status status = ParsePrompts(*prompt, vocab_size, &request.prompts); !status.ok())
    return status;
  if ((request.include_usage || request.continuous_usage) && !request.stream) {
    return Invalid("stream_options", "is only allowed with \"stream\": true");
  }
  if (request.stream && request.prompt_logprobs.value_or(0) > 0) {
    return Invalid("prompt_logprobs", "is not available with \"stream\": true (as in vLLM)");
  }
  // A stream's 0, which vLLM takes, returns nothing.
  if (request.stream) request.prompt_logprobs.reset();
  if (!sampling.has_max_new_tokens()) sampling.set_max_new_tokens(kDefaultMaxTokens);
  for (v1::GenerateRequest& one : request.prompts) {
    *one.mutable_sampling() = sampling;
    one.set_logprobs(logprobs);
    one.set_priority(request.priority);
    if (request.truncate_prompt_tokens)
      one.set_truncate_prompt_tokens(*request.truncate_prompt_tokens);
    if (request.cache_salt) one.set_cache_salt(*request.cache_salt);
    // An echo's logprobs cover its prompt's tokens too, with prompt_logprobs'
    // alternatives when it is given (vLLM's precedence).
    if (request.prompt_logprobs) {
      one.set_prompt_logprobs(*request.prompt_logprobs);
    } else if (request.echo && request.logprobs) {
      one.set_prompt_logprobs(*request.logprobs);
    }
  }
  return request;
}

absl::Status ToApiError(const absl::Status& status, int prompt_index, int prompt_count) {
  if (status.code() != absl::StatusCode::kInvalidArgument) return status;
  const std::string message(status.message());
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return status;
  std::string param = ParamOf(message.substr(0, colon));
  if (param == "prompt" && prompt_count > 1) param = absl::StrCat("prompt[", prompt_index, "]");
  return absl::InvalidArgumentError(absl::StrCat(
      param, ": ",
      absl::StrReplaceAll(message.substr(colon + 2), {{"max_new_tokens", "max_tokens"}})));
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;  // the client went away (nginx's convention); it never reads this
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

ApiError MakeApiError(const absl::Status& status) {
  ApiError error;
  error.http_status = HttpStatusFor(status.code());
  const std::string message(status.message());
  Json param = nullptr;
  // "<param>: ..." where param is a field name (no spaces).
  if (const size_t colon = message.find(": ");
      colon != std::string::npos && colon > 0 && message.find(' ') > colon &&
      status.code() == absl::StatusCode::kInvalidArgument) {
    param = message.substr(0, colon);
  }
  error.body = {{"error",
                 {{"message", message},
                  {"type", ErrorType(error.http_status)},
                  {"param", param},
                  {"code", Lower(absl::StatusCodeToString(status.code()))}}}};
  return error;
}

const char* OpenAiFinishReason(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

std::string TokenString(const Tokenizer& tokenizer, int32_t id, bool as_id) {
  if (as_id) return absl::StrCat("token_id:", id);
  const std::string_view bytes = tokenizer.PieceBytes(id);
  if (IsValidUtf8(bytes)) return std::string(bytes);
  std::string escaped = "bytes:";
  for (const char c : bytes) {
    absl::StrAppend(&escaped, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  }
  return escaped;
}

TextEnd TextEndOf(FinishReason reason, int32_t last_token,
                  const std::vector<int32_t>& stop_token_ids, bool include_stop) {
  if (include_stop) return TextEnd::kAfterLast;
  const bool stop_token =
      reason == FinishReason::kStop &&
      std::find(stop_token_ids.begin(), stop_token_ids.end(), last_token) != stop_token_ids.end();
  return reason == FinishReason::kEos || stop_token ? TextEnd::kBeforeLast : TextEnd::kAfterLast;
}

nlohmann::ordered_json LogprobsObject(const Tokenizer& tokenizer,
                                      const std::vector<GeneratedTokenInfo>& tokens, int top_n,
                                      bool tokens_as_ids, TextOffset* offset, TextEnd end,
                                      bool first_unscored) {
  using OrderedJson = nlohmann::ordered_json;
  OrderedJson strings = OrderedJson::array(), logprobs = OrderedJson::array(),
              tops = OrderedJson::array();
  std::vector<int64_t> starts(tokens.size());
  // The tokens since the last that spelled something, which spell nothing:
  // they start where the next that spells something starts.
  size_t unplaced = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const GeneratedTokenInfo& token = tokens[i];
    const bool in_text = end != TextEnd::kBeforeLast || i + 1 < tokens.size();
    const std::string_view bytes =
        in_text ? tokenizer.PieceBytes(token.token_id, !offset->text_started) : "";
    if (!bytes.empty()) {
      // Where the token starts in the text: the characters the bytes before
      // it end. A token that completes a character another began starts at
      // that character; bytes it shows to start none are a U+FFFD each
      // before it.
      offset->text_started = true;
      const size_t before = offset->pending.size();
      offset->pending.append(bytes);
      const int64_t start =
          offset->characters + static_cast<int64_t>(CharactersEndedWithin(offset->pending, before));
      std::fill(starts.begin() + unplaced, starts.begin() + i + 1, start);
      unplaced = i + 1;
      std::string text;
      offset->pending.erase(0, AppendSanitizedUtf8(offset->pending, false, &text));
      offset->characters += CharacterCount(text);
    }
    strings.push_back(TokenString(tokenizer, token.token_id, tokens_as_ids));
    logprobs.push_back(token.logprob);
    OrderedJson top = OrderedJson::object();
    for (size_t j = 0; j < token.top_logprobs.size() && static_cast<int>(j) < top_n; ++j) {
      const auto& [id, logprob] = token.top_logprobs[j];
      // emplace keeps the first (most likely) of alternatives that spell
      // the same text.
      top.emplace(TokenString(tokenizer, id, tokens_as_ids), logprob);
    }
    tops.push_back(std::move(top));
  }
  if (end != TextEnd::kOpen) {
    // The text ends: an unfinished character is one U+FFFD.
    std::string text;
    AppendSanitizedUtf8(offset->pending, true, &text);
    offset->pending.clear();
    offset->characters += CharacterCount(text);
  }
  std::fill(starts.begin() + unplaced, starts.end(), offset->characters);
  OrderedJson offsets = OrderedJson::array();
  for (const int64_t start : starts) offsets.push_back(start);
  if (first_unscored && !tokens.empty()) {
    logprobs[0] = nullptr;
    tops[0] = nullptr;
  }
  return {{"tokens", std::move(strings)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

nlohmann::ordered_json PromptLogprobsObject(const Tokenizer& tokenizer,
                                            const std::vector<GeneratedTokenInfo>& tokens,
                                            int top_n, bool tokens_as_ids) {
  using OrderedJson = nlohmann::ordered_json;
  // The prompt's first token: nothing predicts it.
  OrderedJson list = OrderedJson::array({nullptr});
  for (const GeneratedTokenInfo& token : tokens) {
    OrderedJson entries = OrderedJson::object();
    auto add = [&](int32_t id, float logprob, int32_t rank) {
      entries[absl::StrCat(id)] = {{"logprob", logprob},
                                   {"rank", rank},
                                   {"decoded_token", TokenString(tokenizer, id, tokens_as_ids)}};
    };
    add(token.token_id, token.logprob, token.rank);
    for (size_t j = 0; j < token.top_logprobs.size() && static_cast<int>(j) < top_n; ++j) {
      add(token.top_logprobs[j].first, token.top_logprobs[j].second, static_cast<int32_t>(j) + 1);
    }
    list.push_back(std::move(entries));
  }
  return list;
}

}  // namespace switchserve
