// Model weights, laid out exactly as the tensors in model.safetensors
// (docs/model-format.md), each stored as f32, bf16 or f16 (Tensor::dtype).
// Owned by ModelWeights; backends read them in place, widening half-precision
// values as they compute, or copy them to their own memory (a GPU's).
#ifndef SWITCHSERVE_ENGINE_MODEL_MODEL_WEIGHTS_H_
#define SWITCHSERVE_ENGINE_MODEL_MODEL_WEIGHTS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/dtype.h"
#include "engine/model/huge_pages.h"
#include "engine/model/model_config.h"

namespace switchserve {

// A dense row-major tensor of F32, BF16 or F16 values. A tensor without values
// is absent (for example a bias the config does not call for). The typed
// accessors check the dtype: f32() of a BF16 tensor aborts.
class Tensor {
 public:
  Tensor() = default;
  // `values` must hold the product of `shape` values.
  static Tensor F32(std::vector<int64_t> shape, std::vector<float> values);
  // Raw 16-bit values (`dtype` BF16 or F16).
  static Tensor Half(std::vector<int64_t> shape, DType dtype, std::vector<uint16_t> bits);
  // `count` values of `dtype` (F32, BF16, F16) copied from little-endian bytes
  // at `data`, which may be unaligned.
  static Tensor FromBytes(std::vector<int64_t> shape, DType dtype, const std::byte* data,
                          size_t count);

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  bool empty() const { return f32_.empty() && half_.empty(); }
  // Values stored (0 when absent).
  int64_t size() const {
    return static_cast<int64_t>(dtype_ == DType::kF32 ? f32_.size() : half_.size());
  }
  // The product of the shape (0 for an empty shape).
  int64_t numel() const;
  int64_t bytes() const { return size() * DTypeSize(dtype_); }

  const float* f32() const;      // dtype F32
  float* mutable_f32();          // dtype F32
  const uint16_t* half() const;  // dtype BF16 or F16: the raw bits
  const void* raw() const;       // any dtype
  // Value i widened to f32.
  float At(int64_t i) const;
  // Every value widened to f32.
  std::vector<float> ToF32() const;
  // The same values stored as `dtype` (F32, BF16, F16; narrowing rounds to
  // nearest even). An absent tensor stays absent.
  Tensor ConvertedTo(DType dtype) const;

  // Mutations for code that builds weights in memory (tests, benchmarks).
  void Clear();
  std::vector<int64_t>& mutable_shape() { return shape_; }

 private:
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kF32;
  // Large tensors on huge pages (engine/model/huge_pages.h).
  HugePageVector<float> f32_;      // dtype F32
  HugePageVector<uint16_t> half_;  // dtype BF16 / F16
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
  // Bytes of every tensor as stored.
  int64_t Bytes() const;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_MODEL_WEIGHTS_H_
