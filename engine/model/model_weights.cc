#include "engine/model/model_weights.h"

namespace switchserve {

int64_t Tensor::numel() const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

int64_t ModelWeights::ParameterCount() const {
  int64_t total = embedding.numel() + lm_head.numel() + lm_head_bias.numel() +
                  final_norm_w.numel() + final_norm_b.numel();
  for (const LayerWeights& layer : layers) {
    for (const Tensor* t :
         {&layer.attn_norm_w, &layer.attn_norm_b, &layer.attn.q, &layer.attn.k, &layer.attn.v,
          &layer.attn.o, &layer.attn.sel_v, &layer.attn.sel_o, &layer.attn.pos_to_pk,
          &layer.ffn_norm_w, &layer.ffn_norm_b, &layer.ffn.router_w, &layer.ffn.router_b,
          &layer.ffn.w1, &layer.ffn.b1, &layer.ffn.w2, &layer.ffn.b2}) {
      total += t->numel();
    }
  }
  return total;
}

}  // namespace switchserve
