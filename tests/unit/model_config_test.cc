#include "engine/model/model_config.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchserve {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// The example from docs/model-format.md.
constexpr char kFullConfig[] = R"({
  "format_version": 1,
  "name": "tiny-switchall",
  "vocab_size": 256,
  "d_model": 64,
  "n_layers": 2,
  "max_seq_len": 512,
  "norm": "layernorm",
  "norm_eps": 1e-5,
  "tie_embeddings": true,
  "output_bias": false,
  "tokenizer": "byte",
  "bos_token_id": null,
  "eos_token_id": null,
  "attention": {
    "type": "switchhead", "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "n_experts": 4,
    "top_k": 2, "gate": "sigmoid", "shared_router": false, "value_routing": "source",
    "position": "rope", "rotate_fraction": 0.5, "rope_base": 10000.0
  },
  "ffn": {
    "type": "moe", "d_ff": 128, "n_experts": 8, "top_k": 2, "gate": "softmax",
    "renormalize": false, "activation": "gelu", "bias": true, "router_bias": false
  },
  "dispatch": {"capacity_factor": 1.25, "min_capacity": 4, "overflow": "drop"}
})";

// Only the required keys.
constexpr char kMinimalConfig[] = R"({
  "format_version": 1, "vocab_size": 300, "d_model": 8, "n_layers": 1, "max_seq_len": 16,
  "norm": "rmsnorm", "tokenizer": "byte",
  "attention": {"type": "switchhead", "n_heads": 2, "head_dim": 4, "n_experts": 3},
  "ffn": {"type": "dense", "d_ff": 32}
})";

absl::StatusOr<ModelConfig> Parse(const std::string& text) {
  return ParseModelConfig(text, "config.json");
}

TEST(ModelConfigTest, ParsesTheDocumentedExample) {
  auto config = Parse(kFullConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "tiny-switchall");
  EXPECT_EQ(config->vocab_size, 256);
  EXPECT_EQ(config->d_model, 64);
  EXPECT_EQ(config->n_layers, 2);
  EXPECT_EQ(config->max_seq_len, 512);
  EXPECT_EQ(config->norm, NormKind::kLayerNorm);
  EXPECT_DOUBLE_EQ(config->norm_eps, 1e-5);
  EXPECT_TRUE(config->tie_embeddings);
  EXPECT_FALSE(config->output_bias);
  EXPECT_EQ(config->tokenizer, TokenizerKind::kByte);
  EXPECT_FALSE(config->bos_token_id.has_value());
  EXPECT_EQ(config->attention.kind, AttentionKind::kSwitchHead);
  EXPECT_EQ(config->attention.n_heads, 4);
  EXPECT_EQ(config->attention.head_dim, 16);
  EXPECT_EQ(config->attention.n_experts, 4);
  EXPECT_EQ(config->attention.top_k, 2);
  EXPECT_EQ(config->attention.position, PositionKind::kRope);
  EXPECT_EQ(config->attention.RotaryDims(), 8);
  EXPECT_EQ(config->ffn.kind, FfnKind::kMoe);
  EXPECT_EQ(config->ffn.n_experts, 8);
  EXPECT_EQ(config->ffn.top_k, 2);
  EXPECT_EQ(config->ffn.activation, Activation::kGelu);
  EXPECT_DOUBLE_EQ(config->dispatch.capacity_factor, 1.25);
  EXPECT_EQ(config->dispatch.min_capacity, 4);
  EXPECT_EQ(config->dispatch.overflow, OverflowPolicy::kDrop);
}

TEST(ModelConfigTest, OmittedKeysTakeTheirDefaults) {
  auto config = Parse(kMinimalConfig);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->name, "");
  EXPECT_DOUBLE_EQ(config->norm_eps, 1e-5);
  EXPECT_TRUE(config->tie_embeddings);
  EXPECT_FALSE(config->output_bias);
  EXPECT_FALSE(config->eos_token_id.has_value());
  EXPECT_EQ(config->attention.n_kv_heads, 2);  // defaults to n_heads
  EXPECT_EQ(config->attention.top_k, 1);
  EXPECT_EQ(config->attention.gate, AttentionGate::kSigmoid);
  EXPECT_FALSE(config->attention.shared_router);
  EXPECT_EQ(config->attention.value_routing, ValueRouting::kSource);
  EXPECT_EQ(config->attention.position, PositionKind::kRope);
  EXPECT_DOUBLE_EQ(config->attention.rotate_fraction, 0.5);
  EXPECT_DOUBLE_EQ(config->attention.rope_base, 10000.0);
  EXPECT_EQ(config->ffn.kind, FfnKind::kDense);
  EXPECT_EQ(config->ffn.n_experts, 1);
  EXPECT_EQ(config->ffn.activation, Activation::kRelu);
  EXPECT_TRUE(config->ffn.bias);
  EXPECT_FALSE(config->ffn.router_bias);
  EXPECT_FALSE(config->ffn.renormalize);
  EXPECT_DOUBLE_EQ(config->dispatch.capacity_factor, 0.0);
  EXPECT_TRUE(config->dispatch.Dropless());
  EXPECT_EQ(config->dispatch.min_capacity, 0);
  EXPECT_EQ(config->dispatch.overflow, OverflowPolicy::kDrop);
  EXPECT_EQ(config->dispatch.scope, CapacityScope::kSequence);
  EXPECT_EQ(config->dispatch.capacity_group, 128);
}

TEST(ModelConfigTest, ParsesCapacityScopeAndGroup) {
  Json json = Json::parse(kFullConfig);
  json["dispatch"]["capacity_group"] = 16;
  auto config = Parse(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->dispatch.scope, CapacityScope::kSequence);
  EXPECT_EQ(config->dispatch.capacity_group, 16);
  EXPECT_TRUE(config->dispatch.CarriesGroupLoads());
  // Sequence scope: C counts G positions, not the step's tokens.
  EXPECT_EQ(config->dispatch.SlotsPerExpert(1000, 2, 8), 5);  // max(4, ceil(1.25*16*2/8))

  json["dispatch"].erase("capacity_group");
  json["dispatch"]["capacity_scope"] = "step";
  config = Parse(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->dispatch.scope, CapacityScope::kStep);
  EXPECT_FALSE(config->dispatch.CarriesGroupLoads());
  EXPECT_EQ(config->dispatch.SlotsPerExpert(1000, 2, 8), 313);  // ceil(1.25*1000*2/8)

  json["dispatch"]["capacity_scope"] = "sequence";
  json["dispatch"]["capacity_factor"] = 0;  // dropless: nothing to carry
  config = Parse(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->dispatch.CarriesGroupLoads());
}

TEST(ModelConfigTest, ParsesVariants) {
  Json json = Json::parse(kFullConfig);
  json["tokenizer"] = "sentencepiece";
  json["vocab_size"] = 100;
  json["bos_token_id"] = 1;
  json["eos_token_id"] = 99;
  json["tie_embeddings"] = false;
  json["attention"]["n_kv_heads"] = 2;
  json["attention"]["gate"] = "softmax_topk";
  json["attention"]["shared_router"] = true;
  json["attention"]["value_routing"] = "destination";
  json["ffn"]["gate"] = "sigmoid";
  json["ffn"]["renormalize"] = true;
  json["ffn"]["activation"] = "silu";
  json["ffn"]["router_bias"] = true;
  json["dispatch"]["overflow"] = "reroute";
  auto config = Parse(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tokenizer, TokenizerKind::kSentencePiece);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_id, 99);
  EXPECT_FALSE(config->tie_embeddings);
  EXPECT_EQ(config->attention.n_kv_heads, 2);
  EXPECT_EQ(config->attention.gate, AttentionGate::kSoftmaxTopK);
  EXPECT_TRUE(config->attention.shared_router);
  EXPECT_EQ(config->attention.value_routing, ValueRouting::kDestination);
  EXPECT_EQ(config->ffn.gate, FfnGate::kSigmoid);
  EXPECT_TRUE(config->ffn.renormalize);
  EXPECT_EQ(config->ffn.activation, Activation::kSilu);
  EXPECT_TRUE(config->ffn.router_bias);
  EXPECT_EQ(config->dispatch.overflow, OverflowPolicy::kReroute);

  Json dense = Json::parse(kMinimalConfig);
  dense["attention"] = {{"type", "dense"}, {"n_heads", 4}, {"n_kv_heads", 1}, {"head_dim", 2}};
  config = Parse(dense.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->attention.kind, AttentionKind::kDense);
  EXPECT_EQ(config->attention.n_experts, 1);
  EXPECT_FALSE(config->attention.IsRouted());
}

// The XL form: no RoPE keys, every attention type, an output bias.
TEST(ModelConfigTest, ParsesXlPositionsAndOutputBias) {
  Json json = Json::parse(kFullConfig);
  json["attention"].erase("rotate_fraction");
  json["attention"].erase("rope_base");
  json["attention"]["position"] = "xl";
  json["attention"]["head_dim"] = 12;  // != d_model / n_heads
  json["output_bias"] = true;
  auto config = Parse(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->attention.position, PositionKind::kXl);
  EXPECT_TRUE(config->attention.IsXl());
  EXPECT_EQ(config->attention.RotaryDims(), 0);
  EXPECT_TRUE(config->output_bias);
  // What ModelConfigToJson writes for it parses back (no rope keys written).
  const Json written = Json::parse(ModelConfigToJson(*config));
  EXPECT_EQ(written["attention"]["position"], "xl");
  EXPECT_FALSE(written["attention"].contains("rotate_fraction"));
  EXPECT_FALSE(written["attention"].contains("rope_base"));
  EXPECT_EQ(written["output_bias"], true);

  json["attention"] = {
      {"type", "dense"}, {"n_heads", 4}, {"n_kv_heads", 2}, {"head_dim", 6}, {"position", "xl"}};
  json["tie_embeddings"] = false;
  config = Parse(json.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->attention.IsXl());
  EXPECT_EQ(config->attention.kind, AttentionKind::kDense);
  EXPECT_FALSE(config->tie_embeddings);
  EXPECT_TRUE(config->output_bias);
}

TEST(ModelConfigTest, XlRefusesRopeKeysAndOddWidth) {
  Json json = Json::parse(kFullConfig);
  json["attention"]["position"] = "xl";
  json["attention"].erase("rope_base");
  EXPECT_THAT(Parse(json.dump()).status().message(),
              HasSubstr("config.json: attention.rotate_fraction: applies to position \"rope\" "
                        "only, not \"xl\""));
  json["attention"].erase("rotate_fraction");
  json["attention"]["rope_base"] = 500.0;
  EXPECT_THAT(Parse(json.dump()).status().message(),
              HasSubstr("config.json: attention.rope_base: applies to position \"rope\" only"));
  json["attention"].erase("rope_base");
  ASSERT_TRUE(Parse(json.dump()).ok()) << Parse(json.dump()).status();
  json["d_model"] = 63;
  auto odd = Parse(json.dump());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(),
              HasSubstr("config.json: d_model: attention.position \"xl\" needs an even d_model "
                        "(sin/cos pairs of width d_model), found 63"));
  json["attention"]["position"] = "rope";  // RoPE has no such constraint
  EXPECT_TRUE(Parse(json.dump()).ok()) << Parse(json.dump()).status();
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  // Compared through the canonical JSON plus a few fields spelled out, so a
  // field that ModelConfigToJson forgot would still show up.
  EXPECT_EQ(ModelConfigToJson(a), ModelConfigToJson(b));
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.attention.rotate_fraction, b.attention.rotate_fraction);
  EXPECT_EQ(a.attention.position, b.attention.position);
  EXPECT_EQ(a.output_bias, b.output_bias);
  EXPECT_EQ(a.attention.n_experts, b.attention.n_experts);
  EXPECT_EQ(a.ffn.top_k, b.ffn.top_k);
  EXPECT_EQ(a.dispatch.capacity_factor, b.dispatch.capacity_factor);
  EXPECT_EQ(a.dispatch.scope, b.dispatch.scope);
  EXPECT_EQ(a.dispatch.capacity_group, b.dispatch.capacity_group);
}

TEST(ModelConfigTest, JsonRoundTrip) {
  Json odd = Json::parse(kFullConfig);
  odd["name"] = "quo\"ted \xc3\xa9";
  odd["norm_eps"] = 1.0 / 3.0;
  odd["eos_token_id"] = 255;
  odd["attention"]["rotate_fraction"] = 0.1;
  odd["dispatch"]["capacity_factor"] = -1.0;
  odd["dispatch"]["capacity_group"] = 7;
  Json step = Json::parse(kFullConfig);
  step["dispatch"]["capacity_scope"] = "step";
  Json xl = Json::parse(kMinimalConfig);
  xl["attention"]["position"] = "xl";
  xl["output_bias"] = true;
  for (const std::string& text : {std::string(kFullConfig), std::string(kMinimalConfig), odd.dump(),
                                  step.dump(), xl.dump()}) {
    auto config = Parse(text);
    ASSERT_TRUE(config.ok()) << config.status();
    auto again = Parse(ModelConfigToJson(*config));
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << ModelConfigToJson(*config);
    ExpectSameConfig(*config, *again);
  }
}

// Each case: a change to the full example and the text the error must contain.
struct BadCase {
  std::string pointer;  // JSON pointer of the key to change
  Json value;           // new value; a discarded value removes the key
  std::string expected;
};

TEST(ModelConfigTest, NormEpsSpansTheFloatRange) {
  for (double eps : {1e-45, 1.0, 3.4028234663852886e38}) {
    Json json = Json::parse(kFullConfig);
    json["norm_eps"] = eps;
    auto config = Parse(json.dump());
    ASSERT_TRUE(config.ok()) << eps << ": " << config.status();
    EXPECT_EQ(config->norm_eps, eps);
  }
}

TEST(ModelConfigTest, RejectsBadValues) {
  const Json kRemove = Json(Json::value_t::discarded);
  const std::vector<BadCase> cases = {
      {"/format_version", 2, "config.json: format_version: expected an integer in [1, 1], found 2"},
      {"/format_version", kRemove, "config.json: format_version: required key is missing"},
      {"/name", 5, "config.json: name: expected a string, found 5"},
      {"/vocab_size", 0, "vocab_size: expected an integer >= 256"},
      {"/vocab_size", 100, "vocab_size: expected an integer >= 256 (tokenizer \"byte\""},
      {"/vocab_size", 300.5, "vocab_size: expected an integer >= 256"},
      {"/vocab_size", "300", "vocab_size: expected an integer >= 256"},
      {"/vocab_size", 4294967296LL, "vocab_size: expected an integer in [256, 2147483647]"},
      {"/d_model", 4611686018427387904LL,
       "d_model: expected an integer in [1, 2147483647], found 4611686018427387904"},
      {"/d_model", -3, "config.json: d_model: expected an integer >= 1, found -3"},
      {"/d_model", kRemove, "d_model: required key is missing"},
      {"/n_layers", 0, "n_layers: expected an integer >= 1, found 0"},
      {"/max_seq_len", nullptr, "max_seq_len: expected an integer >= 1, found null"},
      {"/norm", "batchnorm",
       "norm: expected one of \"layernorm\", \"rmsnorm\", found \"batchnorm\""},
      {"/norm_eps", 0.0,
       "norm_eps: expected a number > 0 that a float holds (>= 1e-45, <= 3.4e38), found 0.0"},
      {"/norm_eps", 1e-50, "norm_eps: expected a number > 0 that a float holds (>= 1e-45"},
      // Beyond the largest float it is infinity there (every norm then
      // outputs its bias alone, while the f64 reference adds a finite eps).
      {"/norm_eps", 1e39,
       "norm_eps: expected a number > 0 that a float holds (>= 1e-45, <= 3.4e38), found 1e+39"},
      {"/norm_eps", 3.4028236e38, "norm_eps: expected a number > 0 that a float holds"},
      {"/norm_eps", "small", "norm_eps: expected a number > 0"},
      {"/tie_embeddings", 1, "tie_embeddings: expected true or false, found 1"},
      {"/tokenizer", "bpe", "tokenizer: expected one of \"byte\", \"sentencepiece\""},
      {"/bos_token_id", 256, "bos_token_id: expected an integer in [0, 255] (below vocab_size)"},
      {"/eos_token_id", -1, "eos_token_id: expected an integer in [0, 255]"},
      {"/attention", kRemove, "config.json: attention: required key is missing"},
      {"/attention", 3, "config.json: attention: expected an object, found 3"},
      {"/attention/type", "linear", "attention.type: expected one of \"switchhead\", \"dense\""},
      {"/attention/n_heads", 0, "attention.n_heads: expected an integer >= 1, found 0"},
      {"/attention/n_kv_heads", 3,
       "attention.n_kv_heads: expected a divisor of attention.n_heads (4), found 3"},
      {"/attention/n_kv_heads", 8,
       "attention.n_kv_heads: expected an integer in [1, 4] (attention.n_heads), found 8"},
      {"/attention/head_dim", kRemove, "attention.head_dim: required key is missing"},
      {"/attention/n_experts", kRemove, "attention.n_experts: required key is missing"},
      {"/attention/top_k", 7,
       "config.json: attention.top_k: expected an integer in [1, 4] (attention.n_experts), found "
       "7"},
      {"/attention/top_k", 0, "attention.top_k: expected an integer in [1, 4]"},
      {"/attention/gate", "softmax",
       "attention.gate: expected one of \"sigmoid\", \"softmax_topk\""},
      {"/attention/shared_router", "no", "attention.shared_router: expected true or false"},
      {"/attention/value_routing", "both", "attention.value_routing: expected one of"},
      {"/attention/rotate_fraction", 1.5,
       "attention.rotate_fraction: expected a number in [0, 1], found 1.5"},
      {"/attention/rope_base", -1, "attention.rope_base: expected a number > 0, found -1"},
      {"/attention/position", "alibi",
       "config.json: attention.position: expected one of \"rope\", \"xl\", found \"alibi\""},
      {"/output_bias", "yes", "config.json: output_bias: expected true or false, found \"yes\""},
      {"/attention/n_head", 4, "config.json: attention.n_head: unknown key"},
      {"/ffn", kRemove, "config.json: ffn: required key is missing"},
      {"/ffn/type", "switch", "ffn.type: expected one of \"moe\", \"dense\""},
      {"/ffn/d_ff", 0, "ffn.d_ff: expected an integer >= 1, found 0"},
      {"/ffn/n_experts", kRemove, "ffn.n_experts: required key is missing"},
      {"/ffn/top_k", 9, "ffn.top_k: expected an integer in [1, 8] (ffn.n_experts), found 9"},
      {"/ffn/gate", "sparsemax", "ffn.gate: expected one of \"softmax\", \"sigmoid\""},
      {"/ffn/renormalize", nullptr, "ffn.renormalize: expected true or false, found null"},
      {"/ffn/activation", "tanh", "ffn.activation: expected one of \"relu\", \"gelu\", \"silu\""},
      {"/ffn/bias", "yes", "ffn.bias: expected true or false"},
      {"/ffn/routerbias", true, "config.json: ffn.routerbias: unknown key"},
      {"/dispatch", "none", "dispatch: expected an object"},
      {"/dispatch/capacity_factor", "1.0", "dispatch.capacity_factor: expected a finite number"},
      {"/dispatch/min_capacity", -1, "dispatch.min_capacity: expected an integer >= 0, found -1"},
      {"/dispatch/overflow", "queue", "dispatch.overflow: expected one of \"drop\", \"reroute\""},
      {"/dispatch/capacity", 1, "config.json: dispatch.capacity: unknown key"},
      {"/dispatch/capacity_scope", "batch",
       "dispatch.capacity_scope: expected one of \"sequence\", \"step\", found \"batch\""},
      {"/dispatch/capacity_group", 0, "dispatch.capacity_group: expected an integer >= 1, found 0"},
      {"/dispatch/capacity_group", 2.5, "dispatch.capacity_group: expected an integer >= 1"},
      {"/n_layer", 2, "config.json: n_layer: unknown key"},
  };
  for (const BadCase& c : cases) {
    Json json = Json::parse(kFullConfig);
    const Json::json_pointer pointer(c.pointer);
    if (c.value.is_discarded()) {
      json[pointer.parent_pointer()].erase(pointer.back());
    } else {
      json[pointer] = c.value;
    }
    auto config = Parse(json.dump());
    ASSERT_FALSE(config.ok()) << c.pointer << " = " << c.value.dump();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.expected)) << c.pointer;
  }
}

TEST(ModelConfigTest, DenseModulesHaveNoExperts) {
  Json json = Json::parse(kMinimalConfig);
  json["ffn"]["n_experts"] = 1;  // harmless
  json["attention"] = {{"type", "dense"}, {"n_heads", 2}, {"head_dim", 4}, {"top_k", 1}};
  ASSERT_TRUE(Parse(json.dump()).ok()) << Parse(json.dump()).status();
  json["ffn"]["n_experts"] = 4;
  EXPECT_THAT(Parse(json.dump()).status().message(),
              HasSubstr("ffn.n_experts: expected an integer in [1, 1] (ffn.type \"dense\""));
  json["ffn"].erase("n_experts");
  json["attention"]["n_experts"] = 2;
  EXPECT_THAT(Parse(json.dump()).status().message(),
              HasSubstr("attention.n_experts: expected an integer in [1, 1] (attention.type"));
  json["attention"].erase("n_experts");
  json["ffn"]["router_bias"] = true;
  EXPECT_THAT(Parse(json.dump()).status().message(), HasSubstr("ffn.router_bias: expected false"));
}

TEST(ModelConfigTest, RejectsBadJson) {
  auto config = ParseModelConfig("{\"vocab_size\": 256,\n  \"d_model\": }", "models/x/config.json");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("models/x/config.json: invalid JSON at byte"));
  EXPECT_THAT(config.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(Parse("").status().message(), HasSubstr("config.json: invalid JSON at byte"));
  EXPECT_THAT(Parse("[1, 2]").status().message(),
              HasSubstr("config.json: expected a JSON object, found [1,2]"));
  EXPECT_THAT(Parse(R"({"d_model": 8, "d_model": 9})").status().message(),
              HasSubstr("config.json: duplicate key \"d_model\""));
  EXPECT_THAT(Parse(std::string(kFullConfig) + " {}").status().message(),
              HasSubstr("invalid JSON"));
}

TEST(ModelConfigTest, ToJsonSurvivesInvalidUtf8Names) {
  auto config = Parse(kMinimalConfig);
  ASSERT_TRUE(config.ok());
  config->name = "bad \xff name";
  auto again = Parse(ModelConfigToJson(*config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->name, HasSubstr("name"));
}

// Refused before it is parsed (the parser builds every level it reads:
// about 90 bytes each), and without recursing per level.
TEST(ModelConfigTest, DeeplyNestedValueIsRefusedBeforeParsing) {
  Json json = Json::parse(kMinimalConfig);
  std::string text = json.dump();
  const std::string nested = std::string(200000, '[') + std::string(200000, ']');
  text.replace(text.find("300"), 3, nested);  // "vocab_size": [[[[...]]]]
  auto config = Parse(text);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("config.json: nests arrays and objects more than 64 levels deep"));
  // 64 levels are parsed (and refused for what they hold).
  text = json.dump();
  text.replace(text.find("300"), 3, std::string(63, '[') + std::string(63, ']'));
  EXPECT_THAT(Parse(text).status().message(),
              HasSubstr("vocab_size: expected an integer >= 256 (tokenizer \"byte\" needs the 256 "
                        "byte ids), found an array of 1 elements"));
}

TEST(ModelConfigTest, CapacityGroupOnlyWithSequenceScope) {
  Json json = Json::parse(kFullConfig);
  json["dispatch"]["capacity_scope"] = "step";
  json["dispatch"]["capacity_group"] = 64;
  EXPECT_THAT(Parse(json.dump()).status().message(),
              HasSubstr("config.json: dispatch.capacity_group: applies to capacity_scope "
                        "\"sequence\" only"));
}

TEST(ModelConfigTest, CapacityScopeNames) {
  EXPECT_EQ(*ParseCapacityScope("step"), CapacityScope::kStep);
  EXPECT_EQ(*ParseCapacityScope("sequence"), CapacityScope::kSequence);
  EXPECT_EQ(ToString(CapacityScope::kSequence), "sequence");
  EXPECT_THAT(ParseCapacityScope("global").status().message(), HasSubstr("found \"global\""));
}

TEST(ModelConfigTest, OverflowPolicyNames) {
  EXPECT_EQ(*ParseOverflowPolicy("reroute"), OverflowPolicy::kReroute);
  EXPECT_EQ(ToString(OverflowPolicy::kDrop), "drop");
  EXPECT_THAT(ParseOverflowPolicy("spill").status().message(), HasSubstr("found \"spill\""));
}

}  // namespace
}  // namespace switchserve
