#include "kernels/cuda/device_weights.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"

namespace switchserve::cuda {
namespace {

// The 16-bit type that holds `values` exactly, bf16 first; bf16 when none does.
WeightType SixteenBitType(const std::vector<float>& values) {
  bool bf16 = true, f16 = true;
  for (float v : values) {
    if (bf16 && __bfloat162float(__float2bfloat16_rn(v)) != v) bf16 = false;
    if (f16 && __half2float(__float2half_rn(v)) != v) f16 = false;
    if (!bf16 && !f16) break;
  }
  return bf16 || !f16 ? WeightType::kBf16 : WeightType::kF16;
}

template <typename T, typename Convert>
std::vector<T> Converted(const std::vector<float>& values, Convert convert) {
  std::vector<T> out(values.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = convert(values[i]);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(
    const ModelConfig& config, const ModelWeights& weights, WeightFormat format,
    bool allow_non_finite_weights, std::vector<std::string>* warnings) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  auto matrix = [&](const Tensor& t) -> absl::StatusOr<DeviceMatrix> {
    std::string problem;
    absl::StatusOr<DeviceMatrix> m = w->Matrix(t, format, allow_non_finite_weights, &problem);
    if (m.ok() ? problem.empty() : m.status().code() != absl::StatusCode::kInvalidArgument) {
      return m;
    }
    // Named as model.safetensors names it.
    std::string named = m.ok() ? problem : std::string(m.status().message());
    for (const ExpectedTensor& e : ExpectedTensors(config)) {
      if (&e.In(weights) == &t) {
        named = absl::StrCat("tensor ", e.name, " ", named);
        break;
      }
    }
    if (!m.ok()) return absl::InvalidArgumentError(named);
    if (warnings != nullptr) warnings->push_back(std::move(named));
    return m;
  };
  auto floats = [&](const Tensor& t) { return w->Floats(t); };
  auto transposed = [&](const Tensor& t) { return w->Transposed(t); };

#define SWITCHSERVE_ASSIGN(lhs, expr)                                     \
  do {                                                                    \
    auto switchserve_assigned = (expr);                                   \
    if (!switchserve_assigned.ok()) return switchserve_assigned.status(); \
    lhs = *switchserve_assigned;                                          \
  } while (0)

  SWITCHSERVE_ASSIGN(w->embedding_, matrix(weights.embedding));
  if (weights.lm_head.empty()) {
    w->output_head_ = w->embedding_;
  } else {
    SWITCHSERVE_ASSIGN(w->output_head_, matrix(weights.lm_head));
  }
  SWITCHSERVE_ASSIGN(w->final_norm_w_, floats(weights.final_norm_w));
  SWITCHSERVE_ASSIGN(w->final_norm_b_, floats(weights.final_norm_b));
  SWITCHSERVE_ASSIGN(w->output_bias_, floats(weights.lm_head_bias));
  w->layers_.resize(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& src = weights.layers[l];
    DeviceLayerWeights& dst = w->layers_[l];
    SWITCHSERVE_ASSIGN(dst.attn_norm_w, floats(src.attn_norm_w));
    SWITCHSERVE_ASSIGN(dst.attn_norm_b, floats(src.attn_norm_b));
    SWITCHSERVE_ASSIGN(dst.ffn_norm_w, floats(src.ffn_norm_w));
    SWITCHSERVE_ASSIGN(dst.ffn_norm_b, floats(src.ffn_norm_b));
    SWITCHSERVE_ASSIGN(dst.attn.q, matrix(src.attn.q));
    SWITCHSERVE_ASSIGN(dst.attn.k, matrix(src.attn.k));
    SWITCHSERVE_ASSIGN(dst.attn.v, matrix(src.attn.v));
    SWITCHSERVE_ASSIGN(dst.attn.o, matrix(src.attn.o));
    SWITCHSERVE_ASSIGN(dst.attn.sel_v, transposed(src.attn.sel_v));
    SWITCHSERVE_ASSIGN(dst.attn.sel_o, transposed(src.attn.sel_o));
    SWITCHSERVE_ASSIGN(dst.attn.pos_to_pk, floats(src.attn.pos_to_pk));
    SWITCHSERVE_ASSIGN(dst.ffn.router_w, transposed(src.ffn.router_w));
    SWITCHSERVE_ASSIGN(dst.ffn.router_b, floats(src.ffn.router_b));
    SWITCHSERVE_ASSIGN(dst.ffn.w1, matrix(src.ffn.w1));
    SWITCHSERVE_ASSIGN(dst.ffn.w2, matrix(src.ffn.w2));
    SWITCHSERVE_ASSIGN(dst.ffn.b1, floats(src.ffn.b1));
    SWITCHSERVE_ASSIGN(dst.ffn.b2, floats(src.ffn.b2));
  }
#undef SWITCHSERVE_ASSIGN
  return w;
}

absl::StatusOr<DeviceMatrix> DeviceWeights::Matrix(const Tensor& t, WeightFormat format,
                                                   bool allow_non_finite, std::string* problem) {
  if (t.empty()) return DeviceMatrix{};
  DeviceBuffer& buffer = buffers_.emplace_back();
  DeviceMatrix m;
  absl::Status s;
  if (format != WeightFormat::kFloat32 && t.dtype() != DType::kF32) {
    // Held in 16 bits already (bf16 or f16): uploaded as held.
    m.type = t.dtype() == DType::kBF16 ? WeightType::kBf16 : WeightType::kF16;
    s = buffer.Upload(t.half(), static_cast<size_t>(t.size()) * sizeof(uint16_t));
  } else {
    const std::vector<float> values = t.ToF32();
    m.type = format == WeightFormat::kFloat32 ? WeightType::kF32 : SixteenBitType(values);
    switch (m.type) {
      case WeightType::kF32:
        s = buffer.Upload(values.data(), values.size() * sizeof(float));
        break;
      case WeightType::kBf16: {
        // Rounded to bf16 here, as the loader narrows with --weights-dtype
        // bf16, and refused as it refuses then a finite value that becomes
        // infinite (beyond bf16's largest, about 3.39e38), unless non-finite
        // weights are allowed (the loader let those stored so pass already).
        const Tensor held = t.ConvertedTo(DType::kBF16);
        if (const int64_t bad = FirstNonFinite(held); bad >= 0 && FirstNonFinite(t) < 0) {
          *problem =
              absl::StrCat("holds non-finite values (element ", bad, " of ", held.size(), " is ",
                           held.At(bad), ") once held as BF16 (the CUDA backend's 16-bit weights; ",
                           "stored ", t.At(bad), ")");
          if (!allow_non_finite) {
            return absl::InvalidArgumentError(
                absl::StrCat(*problem,
                             "; --weights-dtype f32 keeps it in f32, --allow-non-finite-weights "
                             "loads it anyway"));
          }
        }
        s = buffer.Upload(held.half(), static_cast<size_t>(held.size()) * sizeof(uint16_t));
        break;
      }
      case WeightType::kF16: {
        const auto v = Converted<__half>(values, [](float x) { return __float2half_rn(x); });
        s = buffer.Upload(v.data(), v.size() * sizeof(v[0]));
        break;
      }
    }
  }
  if (!s.ok()) return s;
  bytes_ += static_cast<int64_t>(buffer.bytes());
  m.data = buffer.get();
  return m;
}

absl::StatusOr<const float*> DeviceWeights::Floats(const Tensor& t) {
  if (t.empty()) return static_cast<const float*>(nullptr);
  return UploadFloats(t.ToF32());
}

absl::StatusOr<const float*> DeviceWeights::Transposed(const Tensor& t) {
  if (t.empty()) return static_cast<const float*>(nullptr);
  if (t.shape().size() != 2) {
    return absl::InvalidArgumentError("a router matrix must be two-dimensional");
  }
  const int64_t n = t.shape()[0], k = t.shape()[1];
  const std::vector<float> values = t.ToF32();
  std::vector<float> kn(values.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) kn[j * n + i] = values[i * k + j];
  }
  return UploadFloats(kn);
}

absl::StatusOr<const float*> DeviceWeights::UploadFloats(const std::vector<float>& values) {
  DeviceBuffer& buffer = buffers_.emplace_back();
  if (absl::Status s = buffer.Upload(values.data(), values.size() * sizeof(float)); !s.ok()) {
    return s;
  }
  bytes_ += static_cast<int64_t>(buffer.bytes());
  return static_cast<const float*>(buffer.get());
}

}  // namespace switchserve::cuda
