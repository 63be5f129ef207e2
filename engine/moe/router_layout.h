// The routers of a model in one fixed order, and where each one's figures
// sit: the index of its statistics in StepRoutingStats, the offset of its
// choices in a TokenRouting, the label set of its metrics. Backends, the
// metrics and the API's routing traces all index routers through this one
// layout.
//
// Order: layer-major; within a layer the value routers (attn_v, one per KV
// head, or one shared), then the output routers (attn_o, one per query head,
// or one shared), then the FFN router. Dense modules and E = 1 attention have
// no router.
//
// Immutable after construction; safe to share between threads.
#ifndef SWITCHSERVE_ENGINE_MOE_ROUTER_LAYOUT_H_
#define SWITCHSERVE_ENGINE_MOE_ROUTER_LAYOUT_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "engine/model/model_config.h"

namespace switchserve {

enum class MoeModule { kAttnV, kAttnO, kFfn };
std::string_view ToString(MoeModule module);  // "attn_v", "attn_o", "ffn"

// Identifies one router. For attention, `head` is the KV head (attn_v) or query
// head (attn_o), 0 with a shared router; for the FFN it is 0.
struct RouterId {
  int layer = 0;
  MoeModule module = MoeModule::kFfn;
  int head = 0;
  int n_experts = 0;
  int top_k = 0;
};

class RouterLayout {
 public:
  RouterLayout() = default;
  explicit RouterLayout(const ModelConfig& config);

  // Every router, in the order above.
  const std::vector<RouterId>& routers() const { return routers_; }
  size_t size() const { return routers_.size(); }
  bool empty() const { return routers_.empty(); }
  const RouterId& operator[](size_t index) const { return routers_[index]; }

  // Index of `layer`'s first value router: its value routers follow from
  // there, then its output routers. Only meaningful for routed attention.
  int AttentionBase(int layer) const { return attention_base_[layer]; }
  // Index of `layer`'s FFN router. Only meaningful for a MoE FFN.
  int FfnRouter(int layer) const { return ffn_router_[layer]; }
  // Index of router (layer, module, head); -1 when the model has no such
  // router.
  int Find(int layer, MoeModule module, int head) const;

  // Where router `index`'s top_k choices start in a TokenRouting.
  int ChoiceOffset(int index) const { return choice_offset_[index]; }
  // Choices in one token's TokenRouting: the sum of every router's top_k.
  int choices_per_token() const { return choices_per_token_; }

  // Where router `index`'s n_experts per-expert values start in a row that
  // holds every router's (a sequence's carried capacity loads).
  int ExpertOffset(int index) const { return expert_offset_[index]; }
  // The sum of every router's n_experts.
  int total_experts() const { return total_experts_; }

 private:
  std::vector<RouterId> routers_;
  std::vector<int> attention_base_;  // [n_layers]
  std::vector<int> ffn_router_;      // [n_layers]
  std::vector<int> choice_offset_;   // [routers]
  std::vector<int> expert_offset_;   // [routers]
  int choices_per_token_ = 0;
  int total_experts_ = 0;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MOE_ROUTER_LAYOUT_H_
