#include "tests/metrics/synthetic_routing.h"

#include "engine/moe/expert_dispatch.h"

namespace switchserve::testing {
namespace {

ModelConfig SwitchAll(int layers, int heads, int head_experts, int head_k, int ffn_experts,
                      int ffn_k) {
  ModelConfig config;
  config.name = "synthetic";
  config.vocab_size = 256;
  config.d_model = 64;
  config.n_layers = layers;
  config.max_seq_len = 1024;
  config.attention.kind = AttentionKind::kSwitchHead;
  config.attention.n_heads = heads;
  config.attention.n_kv_heads = heads;
  config.attention.head_dim = 16;
  config.attention.n_experts = head_experts;
  config.attention.top_k = head_k;
  config.ffn.kind = FfnKind::kMoe;
  config.ffn.d_ff = 128;
  config.ffn.n_experts = ffn_experts;
  config.ffn.top_k = ffn_k;
  return config;
}

}  // namespace

ModelConfig PaperShapeConfig() { return SwitchAll(18, 4, 4, 2, 32, 1); }

ModelConfig SmallSwitchAllConfig(int layers) { return SwitchAll(layers, 2, 4, 2, 8, 2); }

SyntheticRouting::SyntheticRouting(const ModelConfig& config, uint32_t seed, double skew)
    : config_(config), routers_(RouterLayout(config).routers()), rng_(seed), skew_(skew) {}

StepRoutingStats SyntheticRouting::Step(int tokens, const DispatchConfig& dispatch) {
  StepRoutingStats stats;
  stats.Reset(routers_);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RouterDecision decision;
  ExpertAssignments assignments;
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterId& id = routers_[r];
    logits_.resize(static_cast<size_t>(tokens) * id.n_experts);
    for (int t = 0; t < tokens; ++t) {
      for (int e = 0; e < id.n_experts; ++e) {
        float z = normal(rng_);
        if (id.layer == 0 && e == 0) z += static_cast<float>(skew_);
        logits_[static_cast<size_t>(t) * id.n_experts + e] = z;
      }
    }
    const GateFunction gate =
        id.module == MoeModule::kFfn ? GateFunction::kSoftmax : GateFunction::kSigmoid;
    RouteTokens(logits_.data(), id.n_experts, tokens, id.n_experts, id.top_k, gate,
                /*renormalize=*/false, &decision);
    DispatchTokens(decision, dispatch, /*groups=*/nullptr, &assignments, &stats.routers[r]);
  }
  return stats;
}

}  // namespace switchserve::testing
