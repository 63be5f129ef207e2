#include "engine/model/model_weights.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace switchserve {
namespace {

// A broken contract (a typed accessor of the wrong dtype) is a bug in the
// caller: report it and stop rather than read the wrong storage.
void Require(bool ok, const char* what, DType dtype) {
  if (ok) return;
  std::fprintf(stderr, "Tensor: %s of a %s tensor\n", what, std::string(ToString(dtype)).c_str());
  std::abort();
}

}  // namespace

Tensor Tensor::F32(std::vector<int64_t> shape, std::vector<float> values) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = DType::kF32;
  t.f32_.assign(values.begin(), values.end());
  return t;
}

Tensor Tensor::Half(std::vector<int64_t> shape, DType dtype, std::vector<uint16_t> bits) {
  Require(dtype == DType::kBF16 || dtype == DType::kF16, "Half()", dtype);
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.half_.assign(bits.begin(), bits.end());
  return t;
}

Tensor Tensor::FromBytes(std::vector<int64_t> shape, DType dtype, const std::byte* data,
                         size_t count) {
  // Straight into the tensor's storage: its first touch is this copy
  // (resize() does not zero-fill; see HugePageAllocator).
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  if (dtype == DType::kF32) {
    t.f32_.resize(count);
    if (count > 0) std::memcpy(t.f32_.data(), data, count * sizeof(float));
    return t;
  }
  Require(dtype == DType::kBF16 || dtype == DType::kF16, "FromBytes()", dtype);
  t.half_.resize(count);
  if (count > 0) std::memcpy(t.half_.data(), data, count * sizeof(uint16_t));
  return t;
}

int64_t Tensor::numel() const {
  if (shape_.empty()) return 0;
  int64_t n = 1;
  for (int64_t dim : shape_) n *= dim;
  return n;
}

const float* Tensor::f32() const {
  Require(dtype_ == DType::kF32, "f32()", dtype_);
  return f32_.data();
}

float* Tensor::mutable_f32() {
  Require(dtype_ == DType::kF32, "mutable_f32()", dtype_);
  return f32_.data();
}

const uint16_t* Tensor::half() const {
  Require(dtype_ == DType::kBF16 || dtype_ == DType::kF16, "half()", dtype_);
  return half_.data();
}

const void* Tensor::raw() const {
  return dtype_ == DType::kF32 ? static_cast<const void*>(f32_.data())
                               : static_cast<const void*>(half_.data());
}

float Tensor::At(int64_t i) const {
  switch (dtype_) {
    case DType::kBF16:
      return BFloat16ToFloat(half_[i]);
    case DType::kF16:
      return HalfToFloat(half_[i]);
    default:
      return f32_[i];
  }
}

std::vector<float> Tensor::ToF32() const {
  if (dtype_ == DType::kF32) return std::vector<float>(f32_.begin(), f32_.end());
  std::vector<float> out(half_.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = At(static_cast<int64_t>(i));
  return out;
}

Tensor Tensor::ConvertedTo(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t;
  t.shape_ = shape_;
  t.dtype_ = dtype;
  if (dtype == DType::kF32) {
    t.f32_.resize(static_cast<size_t>(size()));
    for (size_t i = 0; i < t.f32_.size(); ++i) t.f32_[i] = At(static_cast<int64_t>(i));
    return t;
  }
  Require(dtype == DType::kBF16 || dtype == DType::kF16, "ConvertedTo()", dtype);
  t.half_.resize(static_cast<size_t>(size()));
  for (size_t i = 0; i < t.half_.size(); ++i) {
    const float value = At(static_cast<int64_t>(i));
    t.half_[i] = dtype == DType::kBF16 ? FloatToBFloat16(value) : FloatToHalf(value);
  }
  return t;
}

void Tensor::Clear() {
  f32_.clear();
  half_.clear();
}

namespace {

template <typename Weights, typename Fn>
void ForEachTensor(Weights& weights, Fn fn) {
  for (auto* t : {&weights.embedding, &weights.lm_head, &weights.lm_head_bias,
                  &weights.final_norm_w, &weights.final_norm_b}) {
    fn(*t);
  }
  for (auto& layer : weights.layers) {
    for (auto* t :
         {&layer.attn_norm_w, &layer.attn_norm_b, &layer.attn.q, &layer.attn.k, &layer.attn.v,
          &layer.attn.o, &layer.attn.sel_v, &layer.attn.sel_o, &layer.attn.pos_to_pk,
          &layer.ffn_norm_w, &layer.ffn_norm_b, &layer.ffn.router_w, &layer.ffn.router_b,
          &layer.ffn.w1, &layer.ffn.b1, &layer.ffn.w2, &layer.ffn.b2}) {
      fn(*t);
    }
  }
}

}  // namespace

int64_t ModelWeights::ParameterCount() const {
  int64_t total = 0;
  ForEachTensor(*this, [&](const Tensor& t) { total += t.numel(); });
  return total;
}

int64_t ModelWeights::Bytes() const {
  int64_t total = 0;
  ForEachTensor(*this, [&](const Tensor& t) { total += t.bytes(); });
  return total;
}

}  // namespace switchserve
