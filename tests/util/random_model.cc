#include "tests/util/random_model.h"

#include <cmath>
#include <random>

namespace switchserve::testing {
namespace {

class Filler {
 public:
  explicit Filler(uint64_t seed) : rng_(seed) {}

  Tensor Uniform(std::vector<int64_t> shape, double bound) {
    Tensor t;
    t.shape = std::move(shape);
    t.data.resize(t.numel());
    std::uniform_real_distribution<float> dist(static_cast<float>(-bound),
                                               static_cast<float>(bound));
    for (float& v : t.data) v = dist(rng_);
    return t;
  }
  Tensor Linear(std::vector<int64_t> shape, int64_t fan_in) {
    return Uniform(std::move(shape), 1.0 / std::sqrt(static_cast<double>(fan_in)));
  }
  Tensor NormWeight(int64_t d) {
    Tensor t = Uniform({d}, 0.1);
    for (float& v : t.data) v += 1.0f;
    return t;
  }

 private:
  std::mt19937_64 rng_;
};

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
  Filler fill(seed);
  const int64_t d = config.d_model, V = config.vocab_size;
  const AttentionConfig& a = config.attention;
  const int64_t H = a.n_heads, G = a.n_kv_heads, dh = a.head_dim, E = a.n_experts;
  const FfnConfig& f = config.ffn;
  const int64_t F = f.d_ff, X = f.n_experts;
  const bool layernorm = config.norm == NormKind::kLayerNorm;

  ModelWeights w;
  w.embedding = fill.Uniform({V, d}, 1.0);
  if (!config.tie_embeddings) w.lm_head = fill.Linear({V, d}, d);
  w.final_norm_w = fill.NormWeight(d);
  if (layernorm) w.final_norm_b = fill.Uniform({d}, 0.1);
  for (int l = 0; l < config.n_layers; ++l) {
    LayerWeights layer;
    layer.attn_norm_w = fill.NormWeight(d);
    if (layernorm) layer.attn_norm_b = fill.Uniform({d}, 0.1);
    layer.ffn_norm_w = fill.NormWeight(d);
    if (layernorm) layer.ffn_norm_b = fill.Uniform({d}, 0.1);

    AttentionWeights& at = layer.attn;
    at.q = fill.Linear({H * dh, d}, d);
    at.k = fill.Linear({G * dh, d}, d);
    if (a.IsRouted()) {
      const int64_t rv = a.shared_router ? E : G * E;
      const int64_t ro = a.shared_router ? E : H * E;
      at.v = fill.Linear({G * E, d, dh}, d);
      at.o = fill.Linear({H * E, dh, d}, dh);
      at.sel_v = fill.Linear({rv, d}, d);
      at.sel_o = fill.Linear({ro, d}, d);
    } else {
      at.v = fill.Linear({G * dh, d}, d);
      at.o = fill.Linear({d, H * dh}, H * dh);
      if (a.kind == AttentionKind::kSwitchHead) at.sel_o = fill.Linear({H, d}, d);
    }

    FfnWeights& fw = layer.ffn;
    if (f.kind == FfnKind::kDense) {
      fw.w1 = fill.Linear({F, d}, d);
      fw.w2 = fill.Linear({d, F}, F);
      if (f.bias) {
        fw.b1 = fill.Uniform({F}, 0.1);
        fw.b2 = fill.Uniform({d}, 0.1);
      }
    } else {
      fw.router_w = fill.Linear({X, d}, d);
      if (f.router_bias) fw.router_b = fill.Uniform({X}, 0.5);
      fw.w1 = fill.Linear({X, F, d}, d);
      fw.w2 = fill.Linear({X, d, F}, F);
      if (f.bias) {
        fw.b1 = fill.Uniform({X, F}, 0.1);
        fw.b2 = fill.Uniform({X, d}, 0.1);
      }
    }
    w.layers.push_back(std::move(layer));
  }
  return w;
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

std::vector<NamedConfig> AllVariantConfigs() {
  return {{"SwitchAllSigmoid", TinySwitchAllConfig()},
          {"SoftmaxTopK", SwitchHeadSoftmaxTopKConfig()},
          {"SharedRouter", SwitchHeadSharedRouterConfig()},
          {"SwitchHeadGqa", SwitchHeadGqaConfig()},
          {"Destination", SwitchHeadDestinationConfig()},
          {"SingleExpert", SwitchHeadSingleExpertConfig()},
          {"DenseMha", DenseMhaConfig()},
          {"DenseGqa", DenseGqaConfig()}};
}

}  // namespace switchserve::testing
