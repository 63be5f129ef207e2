// Typed model configuration, parsed once from config.json (docs/model-format.md).
// The engine never sees raw JSON: everything here is validated by
// ParseModelConfig.
#ifndef SWITCHSERVE_ENGINE_MODEL_MODEL_CONFIG_H_
#define SWITCHSERVE_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace switchserve {

enum class NormKind { kLayerNorm, kRmsNorm };
enum class TokenizerKind { kByte, kSentencePiece };
enum class AttentionKind { kSwitchHead, kDense };
enum class AttentionGate { kSigmoid, kSoftmaxTopK };
enum class ValueRouting { kSource, kDestination };
// How attention sees token positions: RoPE on q and k, or Transformer-XL
// relative position keys (a learned pos_to_pk per layer applied to a fixed
// sinusoid of j - i; docs/model-format.md).
enum class PositionKind { kRope, kXl };
enum class FfnKind { kMoe, kDense };
enum class FfnGate { kSoftmax, kSigmoid };
enum class Activation { kRelu, kGelu, kSilu };
enum class OverflowPolicy { kDrop, kReroute };
// Which assignments share an expert's capacity (docs/design.md, "Capacity-aware
// dispatch"): each sequence's aligned groups of capacity_group positions, or
// the whole engine step.
enum class CapacityScope { kSequence, kStep };

struct AttentionConfig {
  AttentionKind kind = AttentionKind::kSwitchHead;
  int n_heads = 1;
  int n_kv_heads = 1;
  int head_dim = 1;
  int n_experts = 1;  // E; 1 for dense attention
  int top_k = 1;
  AttentionGate gate = AttentionGate::kSigmoid;
  bool shared_router = false;
  ValueRouting value_routing = ValueRouting::kSource;
  PositionKind position = PositionKind::kRope;
  double rotate_fraction = 0.5;  // rope only
  double rope_base = 10000.0;    // rope only

  // Channels of each head that RoPE rotates: floor(rotate_fraction*dh), even;
  // 0 with XL positions (no RoPE).
  int RotaryDims() const;
  bool IsXl() const { return position == PositionKind::kXl; }
  // True for SwitchHead with E > 1 (routed V and O projections).
  bool IsRouted() const { return kind == AttentionKind::kSwitchHead && n_experts > 1; }
  // Value vectors cached per KV head: E with destination routing, else 1.
  int CachedValuesPerKvHead() const {
    return IsRouted() && value_routing == ValueRouting::kDestination ? n_experts : 1;
  }
  // Number of independent routers (heads with their own gates) per module.
  int ValueRouterHeads() const { return shared_router ? 1 : n_kv_heads; }
  int OutputRouterHeads() const { return shared_router ? 1 : n_heads; }
};

struct FfnConfig {
  FfnKind kind = FfnKind::kDense;
  int d_ff = 1;
  int n_experts = 1;
  int top_k = 1;
  FfnGate gate = FfnGate::kSoftmax;
  bool renormalize = false;
  Activation activation = Activation::kRelu;
  bool bias = true;
  bool router_bias = false;
};

inline constexpr int kDefaultCapacityGroup = 128;

struct DispatchConfig {
  double capacity_factor = 0.0;  // <= 0: dropless
  int min_capacity = 0;
  OverflowPolicy overflow = OverflowPolicy::kDrop;
  CapacityScope scope = CapacityScope::kSequence;
  // G: positions per capacity group of a sequence (>= 1); sequence scope only.
  int capacity_group = kDefaultCapacityGroup;

  bool Dropless() const { return capacity_factor <= 0.0; }
  // Whether a sequence carries per-expert loads from step to step: sequence
  // scope with a capacity limit.
  bool CarriesGroupLoads() const { return scope == CapacityScope::kSequence && !Dropless(); }
  // C = max(min_capacity, ceil(capacity_factor * tokens * k / experts)),
  // computed in double as capacity_factor * tokens * k / experts and
  // saturating at kMaxCapacity (2^62, more than any step's or group's
  // assignments).
  int64_t CapacityPerExpert(int64_t tokens, int k, int experts) const;
  static constexpr int64_t kMaxCapacity = int64_t{1} << 62;
  // The slots per expert one router has for a group (sequence scope: tokens =
  // capacity_group) or for a step of `step_tokens` tokens (step scope).
  int64_t SlotsPerExpert(int64_t step_tokens, int k, int experts) const {
    return CapacityPerExpert(scope == CapacityScope::kSequence ? capacity_group : step_tokens, k,
                             experts);
  }
};

struct ModelConfig {
  std::string name;
  int vocab_size = 0;
  int d_model = 0;
  int n_layers = 0;
  int max_seq_len = 0;
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  bool tie_embeddings = true;
  bool output_bias = false;  // the output head adds lm_head.bias [V]
  TokenizerKind tokenizer = TokenizerKind::kByte;
  std::optional<int> bos_token_id;
  std::optional<int> eos_token_id;
  AttentionConfig attention;
  FfnConfig ffn;
  DispatchConfig dispatch;
};

// Parses and validates config.json text. `file_name` is used in error
// messages, which name the offending key and expected vs found value.
// Unknown keys are errors. For a dense attention or FFN, n_experts and top_k
// may only be given as 1 and router_bias only as false; the switchhead/moe-only
// enums and flags (gate, shared_router, ...) are accepted and have no effect.
// With attention.position "xl", rotate_fraction and rope_base are errors and
// d_model must be even.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text,
                                             std::string_view file_name);

// The inverse of ParseModelConfig: config.json text with every key spelled
// out. Keys that do not apply to the module type (n_experts and top_k of a
// dense attention or FFN, router_bias of a dense FFN, rotate_fraction and
// rope_base with XL positions) are left out, so such fields come back as
// their defaults. Used by WriteModelDirectory.
std::string ModelConfigToJson(const ModelConfig& config);

// Names used in logs, flags and metrics.
std::string_view ToString(OverflowPolicy policy);
absl::StatusOr<OverflowPolicy> ParseOverflowPolicy(std::string_view text);
std::string_view ToString(CapacityScope scope);  // "sequence", "step"
absl::StatusOr<CapacityScope> ParseCapacityScope(std::string_view text);
// The config.json spelling of a value ("softmax_topk", "destination", "xl",
// "sigmoid", "silu", ...).
std::string ConfigName(AttentionGate gate);
std::string ConfigName(ValueRouting routing);
std::string ConfigName(PositionKind position);
std::string ConfigName(FfnGate gate);
std::string ConfigName(Activation activation);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_MODEL_CONFIG_H_
