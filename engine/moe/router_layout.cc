#include "engine/moe/router_layout.h"

namespace switchserve {

std::string_view ToString(MoeModule module) {
  switch (module) {
    case MoeModule::kAttnV:
      return "attn_v";
    case MoeModule::kAttnO:
      return "attn_o";
    case MoeModule::kFfn:
      return "ffn";
  }
  return "?";
}

RouterLayout::RouterLayout(const ModelConfig& config) {
  const AttentionConfig& attn = config.attention;
  for (int layer = 0; layer < config.n_layers; ++layer) {
    attention_base_.push_back(static_cast<int>(routers_.size()));
    if (attn.IsRouted()) {
      for (int h = 0; h < attn.ValueRouterHeads(); ++h) {
        routers_.push_back({layer, MoeModule::kAttnV, h, attn.n_experts, attn.top_k});
      }
      for (int h = 0; h < attn.OutputRouterHeads(); ++h) {
        routers_.push_back({layer, MoeModule::kAttnO, h, attn.n_experts, attn.top_k});
      }
    }
    ffn_router_.push_back(static_cast<int>(routers_.size()));
    if (config.ffn.kind == FfnKind::kMoe) {
      routers_.push_back({layer, MoeModule::kFfn, 0, config.ffn.n_experts, config.ffn.top_k});
    }
  }
  for (const RouterId& id : routers_) {
    choice_offset_.push_back(choices_per_token_);
    choices_per_token_ += id.top_k;
    expert_offset_.push_back(total_experts_);
    total_experts_ += id.n_experts;
  }
}

int RouterLayout::Find(int layer, MoeModule module, int head) const {
  for (size_t i = 0; i < routers_.size(); ++i) {
    const RouterId& id = routers_[i];
    if (id.layer == layer && id.module == module && id.head == head) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace switchserve
