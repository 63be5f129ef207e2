#include "tests/util/random_model.h"

#include <cmath>
#include <random>
#include <string>

#include "engine/model/model_loader.h"
#include "engine/moe/routing_stats.h"

namespace switchserve::testing {
namespace {

ModelConfig Base() {
  ModelConfig c;
  c.name = "tiny-switchall";
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_layers = 2;
  c.max_seq_len = 128;
  c.norm = NormKind::kLayerNorm;
  c.tie_embeddings = true;
  AttentionConfig& a = c.attention;
  a.kind = AttentionKind::kSwitchHead;
  a.n_heads = 4;
  a.n_kv_heads = 4;
  a.head_dim = 8;
  a.n_experts = 4;
  a.top_k = 2;
  a.rotate_fraction = 0.5;
  FfnConfig& f = c.ffn;
  f.kind = FfnKind::kMoe;
  f.d_ff = 48;
  f.n_experts = 4;
  f.top_k = 2;
  f.gate = FfnGate::kSoftmax;
  f.activation = Activation::kGelu;
  f.bias = true;
  return c;
}

}  // namespace

ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ModelWeights weights;
  weights.layers.resize(config.n_layers);
  for (const ExpectedTensor& expected : ExpectedTensors(config)) {
    const std::vector<int64_t>& shape = expected.shape;
    std::vector<float> values(expected.numel());
    const std::string& name = expected.name;
    const auto ends_with = [&name](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    // Linear maps: uniform in +-1/sqrt(fan_in). SwitchHead's expert tensors
    // v [G*E, d, dh] and o [H*E, dh, d] map their middle dimension; every
    // other matrix maps its last.
    double bound = 1.0;
    float offset = 0.0f;
    if (name == "embedding.weight") {
      bound = 1.0;
    } else if (name.find("norm.") != std::string::npos) {
      bound = 0.1;
      if (ends_with(".weight")) offset = 1.0f;
    } else if (ends_with("router.bias")) {
      bound = 0.5;
    } else if (shape.size() == 1 || ends_with(".bias") || ends_with(".b1") || ends_with(".b2")) {
      bound = 0.1;
    } else {
      const bool middle = shape.size() == 3 && (ends_with("attn.v") || ends_with("attn.o"));
      const int64_t fan_in = middle ? shape[1] : shape.back();
      bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    }
    std::uniform_real_distribution<float> dist(static_cast<float>(-bound),
                                               static_cast<float>(bound));
    for (float& v : values) v = offset + dist(rng);
    expected.In(weights) = Tensor::F32(shape, std::move(values));
  }
  return weights;
}

ModelConfig TinySwitchAllConfig() { return Base(); }

ModelConfig SwitchHeadSoftmaxTopKConfig() {
  ModelConfig c = Base();
  c.attention.gate = AttentionGate::kSoftmaxTopK;
  c.ffn.top_k = 1;
  return c;
}

ModelConfig SwitchHeadSharedRouterConfig() {
  ModelConfig c = Base();
  c.attention.shared_router = true;
  c.ffn.gate = FfnGate::kSigmoid;
  c.ffn.router_bias = true;
  return c;
}

ModelConfig SwitchHeadGqaConfig() {
  ModelConfig c = Base();
  c.attention.n_kv_heads = 2;
  c.norm = NormKind::kRmsNorm;
  c.tie_embeddings = false;
  return c;
}

ModelConfig SwitchHeadDestinationConfig() {
  ModelConfig c = Base();
  c.attention.n_kv_heads = 2;
  c.attention.value_routing = ValueRouting::kDestination;
  return c;
}

ModelConfig SwitchHeadSingleExpertConfig() {
  ModelConfig c = Base();
  c.attention.n_experts = 1;
  c.attention.top_k = 1;
  c.attention.rotate_fraction = 1.0;
  c.ffn.kind = FfnKind::kDense;
  c.ffn.n_experts = 1;
  c.ffn.top_k = 1;
  return c;
}

ModelConfig DenseMhaConfig() {
  ModelConfig c = Base();
  c.attention.kind = AttentionKind::kDense;
  c.attention.n_experts = 1;
  c.attention.top_k = 1;
  c.ffn.kind = FfnKind::kDense;
  c.ffn.activation = Activation::kRelu;
  c.ffn.n_experts = 1;
  c.ffn.top_k = 1;
  c.tie_embeddings = false;
  return c;
}

ModelConfig DenseGqaConfig() {
  ModelConfig c = DenseMhaConfig();
  c.attention.n_kv_heads = 2;
  c.ffn.kind = FfnKind::kMoe;
  c.ffn.n_experts = 4;
  c.ffn.top_k = 2;
  c.ffn.renormalize = true;
  c.ffn.activation = Activation::kSilu;
  c.ffn.bias = false;
  c.norm = NormKind::kRmsNorm;
  return c;
}

ModelConfig XlSwitchAllConfig() {
  ModelConfig c = Base();
  c.attention.position = PositionKind::kXl;
  c.attention.n_heads = 3;
  c.attention.n_kv_heads = 3;
  c.attention.head_dim = 12;
  c.attention.n_experts = 5;
  c.attention.top_k = 3;
  c.ffn.gate = FfnGate::kSigmoid;
  c.ffn.activation = Activation::kRelu;
  c.ffn.bias = false;
  c.output_bias = true;
  return c;
}

ModelConfig XlSingleExpertConfig() {
  ModelConfig c = SwitchHeadSingleExpertConfig();
  c.attention.position = PositionKind::kXl;
  c.attention.n_heads = 2;
  c.attention.n_kv_heads = 2;
  c.attention.head_dim = 20;
  c.norm = NormKind::kRmsNorm;
  c.tie_embeddings = false;
  c.output_bias = true;
  return c;
}

ModelConfig XlDenseGqaConfig() {
  ModelConfig c = DenseGqaConfig();
  c.attention.position = PositionKind::kXl;
  c.attention.head_dim = 6;
  c.ffn.top_k = 1;
  c.ffn.renormalize = false;
  return c;
}

ModelConfig XlSharedDestinationConfig() {
  ModelConfig c = SwitchHeadDestinationConfig();
  c.attention.position = PositionKind::kXl;
  c.attention.shared_router = true;
  c.attention.gate = AttentionGate::kSoftmaxTopK;
  return c;
}

ModelConfig PaperSwitchAllConfig() {
  ModelConfig c;
  c.name = "paper-262m-switchall";
  c.vocab_size = 8000;
  c.d_model = 1024;
  c.n_layers = 18;
  c.max_seq_len = 2048;
  c.norm = NormKind::kLayerNorm;
  c.attention.kind = AttentionKind::kSwitchHead;
  c.attention.n_heads = 4;
  c.attention.n_kv_heads = 4;
  c.attention.head_dim = 112;
  c.attention.n_experts = 4;
  c.attention.top_k = 2;
  c.attention.gate = AttentionGate::kSigmoid;
  c.ffn.kind = FfnKind::kMoe;
  c.ffn.d_ff = 128;
  c.ffn.n_experts = 32;
  c.ffn.top_k = 4;
  c.ffn.gate = FfnGate::kSigmoid;
  c.ffn.activation = Activation::kRelu;
  c.ffn.bias = false;
  return c;
}

std::vector<NamedConfig> AllVariantConfigs() {
  return {{"SwitchAllSigmoid", TinySwitchAllConfig()},
          {"SoftmaxTopK", SwitchHeadSoftmaxTopKConfig()},
          {"SharedRouter", SwitchHeadSharedRouterConfig()},
          {"SwitchHeadGqa", SwitchHeadGqaConfig()},
          {"Destination", SwitchHeadDestinationConfig()},
          {"SingleExpert", SwitchHeadSingleExpertConfig()},
          {"DenseMha", DenseMhaConfig()},
          {"DenseGqa", DenseGqaConfig()},
          {"XlSwitchAll", XlSwitchAllConfig()},
          {"XlSingleExpert", XlSingleExpertConfig()},
          {"XlDenseGqa", XlDenseGqaConfig()},
          {"XlSharedDestination", XlSharedDestinationConfig()}};
}

std::vector<NamedConfig> RoutedVariantConfigs() {
  std::vector<NamedConfig> routed;
  for (NamedConfig& named : AllVariantConfigs()) {
    if (!RouterLayout(named.config).empty()) routed.push_back(std::move(named));
  }
  return routed;
}

}  // namespace switchserve::testing
