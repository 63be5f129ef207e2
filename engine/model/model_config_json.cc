// ParseModelConfig and ModelConfigToJson: config.json <-> ModelConfig
// (docs/model-format.md is the schema).
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/json_text.h"
#include "engine/model/model_config.h"

namespace switchserve {
namespace {

using Json = nlohmann::json;

// Reads the keys of one JSON object, remembering which were consumed so that
// Finish() can reject the rest. Each getter returns an error that names the
// file and the full key path ("config.json: attention.top_k: ...").
class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string file, std::string prefix)
      : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool Has(const std::string& key) const { return object_.contains(key); }

  std::string Path(const std::string& key) const { return prefix_ + key; }

  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", Path(key), ": ", what));
  }

  // Looks up `key`; nullptr when absent (an error when `required`).
  absl::StatusOr<const Json*> Find(const std::string& key, bool required) {
    seen_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end()) {
      if (required) return Error(key, "required key is missing");
      return nullptr;
    }
    return &*it;
  }

  // An integer in [min, max]; `range_note` explains a bound that comes from
  // another key (e.g. "(attention.n_experts)").
  absl::Status Int(const std::string& key, int64_t min, int64_t max, std::optional<int> fallback,
                   int* out, const std::string& range_note = "") {
    auto found = Find(key, !fallback.has_value());
    if (!found.ok()) return found.status();
    if (*found == nullptr) {
      *out = *fallback;
      return absl::OkStatus();
    }
    const Json& value = **found;
    bool in_range = false;
    int64_t v = 0;
    if (value.is_number_unsigned()) {
      const uint64_t u = value.get<uint64_t>();
      in_range = u <= static_cast<uint64_t>(max);
      v = static_cast<int64_t>(std::min<uint64_t>(u, std::numeric_limits<int64_t>::max()));
    } else if (value.is_number_integer()) {
      v = value.get<int64_t>();
      in_range = v >= min && v <= max;
    }
    if (!in_range || v < min) {
      // ">= 1" reads well for a value below; one above the 32-bit limit
      // needs the limit.
      const bool above = value.is_number_integer() && v > max;
      const std::string upper = !above && max == std::numeric_limits<int32_t>::max()
                                    ? absl::StrCat("expected an integer >= ", min)
                                    : absl::StrCat("expected an integer in [", min, ", ", max, "]");
      return Error(key, absl::StrCat(upper, range_note.empty() ? "" : " ", range_note, ", found ",
                                     DescribeJson(value)));
    }
    *out = static_cast<int>(v);
    return absl::OkStatus();
  }

  // A finite number satisfying `ok`, described by `expected` in errors.
  template <typename Pred>
  absl::Status Number(const std::string& key, std::optional<double> fallback, Pred ok,
                      const std::string& expected, double* out) {
    auto found = Find(key, !fallback.has_value());
    if (!found.ok()) return found.status();
    if (*found == nullptr) {
      *out = *fallback;
      return absl::OkStatus();
    }
    const Json& value = **found;
    if (!value.is_number() || !std::isfinite(value.get<double>()) || !ok(value.get<double>())) {
      return Error(key, absl::StrCat("expected ", expected, ", found ", DescribeJson(value)));
    }
    *out = value.get<double>();
    return absl::OkStatus();
  }

  absl::Status Bool(const std::string& key, std::optional<bool> fallback, bool* out) {
    auto found = Find(key, !fallback.has_value());
    if (!found.ok()) return found.status();
    if (*found == nullptr) {
      *out = *fallback;
      return absl::OkStatus();
    }
    if (!(*found)->is_boolean()) {
      return Error(key, absl::StrCat("expected true or false, found ", DescribeJson(**found)));
    }
    *out = (*found)->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const std::string& key, std::optional<std::string> fallback,
                      std::string* out) {
    auto found = Find(key, !fallback.has_value());
    if (!found.ok()) return found.status();
    if (*found == nullptr) {
      *out = *fallback;
      return absl::OkStatus();
    }
    if (!(*found)->is_string()) {
      return Error(key, absl::StrCat("expected a string, found ", DescribeJson(**found)));
    }
    *out = (*found)->get<std::string>();
    return absl::OkStatus();
  }

  // One of the named values of an enum.
  template <typename E>
  absl::Status Enum(const std::string& key, std::optional<E> fallback,
                    const std::vector<std::pair<std::string, E>>& names, E* out) {
    auto found = Find(key, !fallback.has_value());
    if (!found.ok()) return found.status();
    if (*found == nullptr) {
      *out = *fallback;
      return absl::OkStatus();
    }
    if ((*found)->is_string()) {
      for (const auto& [name, value] : names) {
        if ((*found)->template get<std::string>() == name) {
          *out = value;
          return absl::OkStatus();
        }
      }
    }
    std::vector<std::string> quoted;
    for (const auto& entry : names) quoted.push_back(absl::StrCat("\"", entry.first, "\""));
    return Error(key, absl::StrCat("expected one of ", absl::StrJoin(quoted, ", "), ", found ",
                                   DescribeJson(**found)));
  }

  // A nested object (required).
  absl::StatusOr<const Json*> Object(const std::string& key, bool required) {
    auto found = Find(key, required);
    if (!found.ok() || *found == nullptr) return found;
    if (!(*found)->is_object()) {
      return Error(key, absl::StrCat("expected an object, found ", DescribeJson(**found)));
    }
    return found;
  }

  absl::Status Finish() const {
    for (const auto& [key, value] : object_.items()) {
      if (seen_.count(key) == 0) return Error(key, "unknown key");
    }
    return absl::OkStatus();
  }

 private:
  const Json& object_;
  std::string file_;
  std::string prefix_;
  std::set<std::string> seen_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

#define RETURN_IF_ERROR(expr)                                         \
  do {                                                                \
    if (absl::Status _status = (expr); !_status.ok()) return _status; \
  } while (0)

const std::vector<std::pair<std::string, NormKind>> kNormNames = {
    {"layernorm", NormKind::kLayerNorm}, {"rmsnorm", NormKind::kRmsNorm}};
const std::vector<std::pair<std::string, TokenizerKind>> kTokenizerNames = {
    {"byte", TokenizerKind::kByte}, {"sentencepiece", TokenizerKind::kSentencePiece}};
const std::vector<std::pair<std::string, AttentionKind>> kAttentionNames = {
    {"switchhead", AttentionKind::kSwitchHead}, {"dense", AttentionKind::kDense}};
const std::vector<std::pair<std::string, AttentionGate>> kAttentionGateNames = {
    {"sigmoid", AttentionGate::kSigmoid}, {"softmax_topk", AttentionGate::kSoftmaxTopK}};
const std::vector<std::pair<std::string, ValueRouting>> kValueRoutingNames = {
    {"source", ValueRouting::kSource}, {"destination", ValueRouting::kDestination}};
const std::vector<std::pair<std::string, PositionKind>> kPositionNames = {
    {"rope", PositionKind::kRope}, {"xl", PositionKind::kXl}};
const std::vector<std::pair<std::string, FfnKind>> kFfnNames = {{"moe", FfnKind::kMoe},
                                                                {"dense", FfnKind::kDense}};
const std::vector<std::pair<std::string, FfnGate>> kFfnGateNames = {{"softmax", FfnGate::kSoftmax},
                                                                    {"sigmoid", FfnGate::kSigmoid}};
const std::vector<std::pair<std::string, Activation>> kActivationNames = {
    {"relu", Activation::kRelu}, {"gelu", Activation::kGelu}, {"silu", Activation::kSilu}};
const std::vector<std::pair<std::string, OverflowPolicy>> kOverflowNames = {
    {"drop", OverflowPolicy::kDrop}, {"reroute", OverflowPolicy::kReroute}};
const std::vector<std::pair<std::string, CapacityScope>> kScopeNames = {
    {"sequence", CapacityScope::kSequence}, {"step", CapacityScope::kStep}};

template <typename E>
std::string NameOf(const std::vector<std::pair<std::string, E>>& names, E value) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "?";
}

// An optional token id: absent or null -> nullopt, else in [0, vocab_size).
absl::Status TokenId(ObjectReader& reader, const std::string& key, int vocab_size,
                     std::optional<int>* out) {
  auto found = reader.Find(key, /*required=*/false);
  if (!found.ok()) return found.status();
  if (*found == nullptr || (*found)->is_null()) {
    out->reset();
    return absl::OkStatus();
  }
  int id = 0;
  RETURN_IF_ERROR(
      reader.Int(key, 0, vocab_size - 1, std::nullopt, &id, "(below vocab_size) or null"));
  *out = id;
  return absl::OkStatus();
}

// `key` may only appear with value 1 (a dense module has one "expert").
absl::Status OnlyOne(ObjectReader& reader, const std::string& key, const std::string& why,
                     int* out) {
  return reader.Int(key, 1, 1, 1, out, why);
}

absl::Status ParseAttention(ObjectReader& reader, AttentionConfig* attn) {
  RETURN_IF_ERROR(reader.Enum<AttentionKind>("type", std::nullopt, kAttentionNames, &attn->kind));
  RETURN_IF_ERROR(reader.Int("n_heads", 1, kMaxInt, std::nullopt, &attn->n_heads));
  RETURN_IF_ERROR(reader.Int("n_kv_heads", 1, attn->n_heads, attn->n_heads, &attn->n_kv_heads,
                             "(attention.n_heads)"));
  if (attn->n_heads % attn->n_kv_heads != 0) {
    return reader.Error("n_kv_heads", absl::StrCat("expected a divisor of attention.n_heads (",
                                                   attn->n_heads, "), found ", attn->n_kv_heads));
  }
  RETURN_IF_ERROR(reader.Int("head_dim", 1, kMaxInt, std::nullopt, &attn->head_dim));
  if (attn->kind == AttentionKind::kSwitchHead) {
    RETURN_IF_ERROR(reader.Int("n_experts", 1, kMaxInt, std::nullopt, &attn->n_experts));
    RETURN_IF_ERROR(
        reader.Int("top_k", 1, attn->n_experts, 1, &attn->top_k, "(attention.n_experts)"));
  } else {
    const std::string why = "(attention.type \"dense\" has no experts)";
    RETURN_IF_ERROR(OnlyOne(reader, "n_experts", why, &attn->n_experts));
    RETURN_IF_ERROR(OnlyOne(reader, "top_k", why, &attn->top_k));
  }
  RETURN_IF_ERROR(reader.Enum<AttentionGate>("gate", AttentionGate::kSigmoid, kAttentionGateNames,
                                             &attn->gate));
  RETURN_IF_ERROR(reader.Bool("shared_router", false, &attn->shared_router));
  RETURN_IF_ERROR(reader.Enum<ValueRouting>("value_routing", ValueRouting::kSource,
                                            kValueRoutingNames, &attn->value_routing));
  RETURN_IF_ERROR(
      reader.Enum<PositionKind>("position", PositionKind::kRope, kPositionNames, &attn->position));
  if (attn->position == PositionKind::kXl) {
    for (const char* rope_key : {"rotate_fraction", "rope_base"}) {
      if (reader.Has(rope_key)) {
        return reader.Error(rope_key,
                            "applies to position \"rope\" only, not \"xl\" (no RoPE there)");
      }
    }
    return reader.Finish();
  }
  RETURN_IF_ERROR(reader.Number(
      "rotate_fraction", 0.5, [](double f) { return f >= 0.0 && f <= 1.0; }, "a number in [0, 1]",
      &attn->rotate_fraction));
  RETURN_IF_ERROR(reader.Number(
      "rope_base", 10000.0, [](double b) { return b > 0.0; }, "a number > 0", &attn->rope_base));
  return reader.Finish();
}

absl::Status ParseFfn(ObjectReader& reader, FfnConfig* ffn) {
  RETURN_IF_ERROR(reader.Enum<FfnKind>("type", std::nullopt, kFfnNames, &ffn->kind));
  RETURN_IF_ERROR(reader.Int("d_ff", 1, kMaxInt, std::nullopt, &ffn->d_ff));
  if (ffn->kind == FfnKind::kMoe) {
    RETURN_IF_ERROR(reader.Int("n_experts", 1, kMaxInt, std::nullopt, &ffn->n_experts));
    RETURN_IF_ERROR(reader.Int("top_k", 1, ffn->n_experts, 1, &ffn->top_k, "(ffn.n_experts)"));
  } else {
    const std::string why = "(ffn.type \"dense\" has no experts)";
    RETURN_IF_ERROR(OnlyOne(reader, "n_experts", why, &ffn->n_experts));
    RETURN_IF_ERROR(OnlyOne(reader, "top_k", why, &ffn->top_k));
  }
  RETURN_IF_ERROR(reader.Enum<FfnGate>("gate", FfnGate::kSoftmax, kFfnGateNames, &ffn->gate));
  RETURN_IF_ERROR(reader.Bool("renormalize", false, &ffn->renormalize));
  RETURN_IF_ERROR(
      reader.Enum<Activation>("activation", Activation::kRelu, kActivationNames, &ffn->activation));
  RETURN_IF_ERROR(reader.Bool("bias", true, &ffn->bias));
  RETURN_IF_ERROR(reader.Bool("router_bias", false, &ffn->router_bias));
  if (ffn->kind == FfnKind::kDense && ffn->router_bias) {
    return reader.Error("router_bias",
                        "expected false for ffn.type \"dense\" (no router), found true");
  }
  return reader.Finish();
}

absl::Status ParseDispatch(ObjectReader& reader, DispatchConfig* dispatch) {
  RETURN_IF_ERROR(reader.Number(
      "capacity_factor", 0.0, [](double) { return true; }, "a finite number",
      &dispatch->capacity_factor));
  RETURN_IF_ERROR(reader.Int("min_capacity", 0, kMaxInt, 0, &dispatch->min_capacity));
  RETURN_IF_ERROR(reader.Enum<OverflowPolicy>("overflow", OverflowPolicy::kDrop, kOverflowNames,
                                              &dispatch->overflow));
  RETURN_IF_ERROR(reader.Enum<CapacityScope>("capacity_scope", CapacityScope::kSequence,
                                             kScopeNames, &dispatch->scope));
  if (dispatch->scope == CapacityScope::kStep && reader.Has("capacity_group")) {
    return reader.Error("capacity_group", "applies to capacity_scope \"sequence\" only");
  }
  RETURN_IF_ERROR(
      reader.Int("capacity_group", 1, kMaxInt, kDefaultCapacityGroup, &dispatch->capacity_group));
  return reader.Finish();
}

}  // namespace

std::string ConfigName(AttentionGate gate) { return NameOf(kAttentionGateNames, gate); }
std::string ConfigName(ValueRouting routing) { return NameOf(kValueRoutingNames, routing); }
std::string ConfigName(PositionKind position) { return NameOf(kPositionNames, position); }
std::string ConfigName(FfnGate gate) { return NameOf(kFfnGateNames, gate); }
std::string ConfigName(Activation activation) { return NameOf(kActivationNames, activation); }

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text,
                                             std::string_view file_name) {
  const std::string file(file_name);
  absl::StatusOr<Json> document = ParseJsonText(json_text, file);
  if (!document.ok()) return document.status();
  if (!document->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": expected a JSON object, found ", DescribeJson(*document)));
  }
  ModelConfig config;
  ObjectReader top(*document, file, "");
  int format_version = 0;
  RETURN_IF_ERROR(top.Int("format_version", 1, 1, std::nullopt, &format_version));
  RETURN_IF_ERROR(top.String("name", "", &config.name));
  RETURN_IF_ERROR(
      top.Enum<TokenizerKind>("tokenizer", std::nullopt, kTokenizerNames, &config.tokenizer));
  if (config.tokenizer == TokenizerKind::kByte) {
    // Every byte value must be a valid token id.
    RETURN_IF_ERROR(top.Int("vocab_size", 256, kMaxInt, std::nullopt, &config.vocab_size,
                            "(tokenizer \"byte\" needs the 256 byte ids)"));
  } else {
    RETURN_IF_ERROR(top.Int("vocab_size", 1, kMaxInt, std::nullopt, &config.vocab_size));
  }
  RETURN_IF_ERROR(top.Int("d_model", 1, kMaxInt, std::nullopt, &config.d_model));
  RETURN_IF_ERROR(top.Int("n_layers", 1, kMaxInt, std::nullopt, &config.n_layers));
  RETURN_IF_ERROR(top.Int("max_seq_len", 1, kMaxInt, std::nullopt, &config.max_seq_len));
  RETURN_IF_ERROR(top.Enum<NormKind>("norm", std::nullopt, kNormNames, &config.norm));
  // The backends add it as a float: one that rounds to 0 there (under about
  // 7e-46) would divide an all-zero row by 0, and one beyond the largest
  // float is infinity there (and converting it to float is undefined).
  RETURN_IF_ERROR(top.Number(
      "norm_eps", 1e-5,
      [](double e) {
        return e > 0.0 && e <= std::numeric_limits<float>::max() && static_cast<float>(e) > 0.0f;
      },
      "a number > 0 that a float holds (>= 1e-45, <= 3.4e38)", &config.norm_eps));
  RETURN_IF_ERROR(top.Bool("tie_embeddings", true, &config.tie_embeddings));
  RETURN_IF_ERROR(top.Bool("output_bias", false, &config.output_bias));
  RETURN_IF_ERROR(TokenId(top, "bos_token_id", config.vocab_size, &config.bos_token_id));
  RETURN_IF_ERROR(TokenId(top, "eos_token_id", config.vocab_size, &config.eos_token_id));

  absl::StatusOr<const Json*> attention = top.Object("attention", /*required=*/true);
  if (!attention.ok()) return attention.status();
  ObjectReader attention_reader(**attention, file, "attention.");
  RETURN_IF_ERROR(ParseAttention(attention_reader, &config.attention));
  if (config.attention.IsXl() && config.d_model % 2 != 0) {
    return top.Error("d_model", absl::StrCat("attention.position \"xl\" needs an even d_model "
                                             "(sin/cos pairs of width d_model), found ",
                                             config.d_model));
  }

  absl::StatusOr<const Json*> ffn = top.Object("ffn", /*required=*/true);
  if (!ffn.ok()) return ffn.status();
  ObjectReader ffn_reader(**ffn, file, "ffn.");
  RETURN_IF_ERROR(ParseFfn(ffn_reader, &config.ffn));

  absl::StatusOr<const Json*> dispatch = top.Object("dispatch", /*required=*/false);
  if (!dispatch.ok()) return dispatch.status();
  if (*dispatch != nullptr) {
    ObjectReader dispatch_reader(**dispatch, file, "dispatch.");
    RETURN_IF_ERROR(ParseDispatch(dispatch_reader, &config.dispatch));
  }
  RETURN_IF_ERROR(top.Finish());
  return config;
}

std::string ModelConfigToJson(const ModelConfig& config) {
  const AttentionConfig& a = config.attention;
  const FfnConfig& f = config.ffn;
  Json attention = {{"type", NameOf(kAttentionNames, a.kind)},
                    {"n_heads", a.n_heads},
                    {"n_kv_heads", a.n_kv_heads},
                    {"head_dim", a.head_dim}};
  if (a.kind == AttentionKind::kSwitchHead) {
    attention["n_experts"] = a.n_experts;
    attention["top_k"] = a.top_k;
  }
  attention["gate"] = NameOf(kAttentionGateNames, a.gate);
  attention["shared_router"] = a.shared_router;
  attention["value_routing"] = NameOf(kValueRoutingNames, a.value_routing);
  attention["position"] = NameOf(kPositionNames, a.position);
  if (!a.IsXl()) {
    attention["rotate_fraction"] = a.rotate_fraction;
    attention["rope_base"] = a.rope_base;
  }

  Json ffn = {{"type", NameOf(kFfnNames, f.kind)}, {"d_ff", f.d_ff}};
  if (f.kind == FfnKind::kMoe) {
    ffn["n_experts"] = f.n_experts;
    ffn["top_k"] = f.top_k;
    ffn["router_bias"] = f.router_bias;
  }
  ffn["gate"] = NameOf(kFfnGateNames, f.gate);
  ffn["renormalize"] = f.renormalize;
  ffn["activation"] = NameOf(kActivationNames, f.activation);
  ffn["bias"] = f.bias;

  const DispatchConfig& d = config.dispatch;
  Json dispatch = {{"capacity_factor", d.capacity_factor},
                   {"min_capacity", d.min_capacity},
                   {"overflow", NameOf(kOverflowNames, d.overflow)},
                   {"capacity_scope", NameOf(kScopeNames, d.scope)}};
  if (d.scope == CapacityScope::kSequence) dispatch["capacity_group"] = d.capacity_group;

  Json document = {
      {"format_version", 1},
      {"name", config.name},
      {"vocab_size", config.vocab_size},
      {"d_model", config.d_model},
      {"n_layers", config.n_layers},
      {"max_seq_len", config.max_seq_len},
      {"norm", NameOf(kNormNames, config.norm)},
      {"norm_eps", config.norm_eps},
      {"tie_embeddings", config.tie_embeddings},
      {"output_bias", config.output_bias},
      {"tokenizer", NameOf(kTokenizerNames, config.tokenizer)},
      {"bos_token_id", config.bos_token_id ? Json(*config.bos_token_id) : Json(nullptr)},
      {"eos_token_id", config.eos_token_id ? Json(*config.eos_token_id) : Json(nullptr)},
      {"attention", std::move(attention)},
      {"ffn", std::move(ffn)},
      {"dispatch", std::move(dispatch)},
  };
  // A name built in code may hold invalid UTF-8: replace it rather than throw.
  return document.dump(2, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace) + "\n";
}

}  // namespace switchserve
