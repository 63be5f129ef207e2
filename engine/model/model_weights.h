// Model weights in f32, laid out exactly as the tensors in model.safetensors
// (docs/model-format.md). Owned by ModelWeights; backends read them and may
// copy them to their own memory (the CUDA backend converts to bf16).
#ifndef SWITCHSERVE_ENGINE_MODEL_MODEL_WEIGHTS_H_
#define SWITCHSERVE_ENGINE_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace switchserve {

// A dense f32 tensor. Empty `data` means the tensor is absent (for example a
// bias the config does not call for).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  bool empty() const { return data.empty(); }
  int64_t numel() const;
  const float* ptr() const { return data.data(); }
};

struct AttentionWeights {
  Tensor q;      // [H*dh, d]
  Tensor k;      // [G*dh, d]
  Tensor v;      // routed: [G*E, d, dh]; E = 1 and dense: [G*dh, d]
  Tensor o;      // routed: [H*E, dh, d]; E = 1 and dense: [d, H*dh]
  Tensor sel_v;  // routed: [G*E, d] or [E, d] shared; else empty
  Tensor sel_o;  // routed: [H*E, d] or [E, d] shared; E = 1: [H, d]; dense: empty
  // XL positions: [H*dh, d], rows h*dh..(h+1)*dh map the sinusoid to query
  // head h's position key; empty with RoPE.
  Tensor pos_to_pk;
};

struct FfnWeights {
  // Dense: w1 [F, d], b1 [F], w2 [d, F], b2 [d].
  // MoE:   w1 [X, F, d], b1 [X, F], w2 [X, d, F], b2 [X, d]; router [X, d].
  Tensor router_w;
  Tensor router_b;
  Tensor w1;
  Tensor b1;
  Tensor w2;
  Tensor b2;
};

struct LayerWeights {
  Tensor attn_norm_w;
  Tensor attn_norm_b;  // layernorm only
  AttentionWeights attn;
  Tensor ffn_norm_w;
  Tensor ffn_norm_b;  // layernorm only
  FfnWeights ffn;
};

struct ModelWeights {
  Tensor embedding;     // [V, d]
  Tensor lm_head;       // [V, d]; empty when tied (use embedding)
  Tensor lm_head_bias;  // [V] with output_bias (tied or not); else empty
  Tensor final_norm_w;
  Tensor final_norm_b;
  std::vector<LayerWeights> layers;

  const Tensor& OutputHead() const { return lm_head.empty() ? embedding : lm_head; }
  int64_t ParameterCount() const;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_MODEL_WEIGHTS_H_
