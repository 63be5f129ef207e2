// The model's weights in device memory, uploaded once from ModelWeights.
//
// Matrices (embedding, output head, q/k/v/o, expert FFNs) are kept in a
// 16-bit type in the default format: bf16, or f16 for a tensor whose values
// are all exactly f16 numbers but not all bf16 numbers (an f16 checkpoint
// stays f16; a bf16 one stays bf16; anything else is rounded to bf16 once,
// here). With WeightFormat::kFloat32 every matrix stays f32 (parity tests).
// Routers, norms and biases are always f32: routing decisions and the
// residual stream are computed in f32.
#ifndef SWITCHSERVE_KERNELS_CUDA_DEVICE_WEIGHTS_H_
#define SWITCHSERVE_KERNELS_CUDA_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/linear.h"

namespace switchserve::cuda {

enum class WeightFormat { k16Bit, kFloat32 };

// A matrix on the device: null data when the model has no such tensor.
struct DeviceMatrix {
  const void* data = nullptr;
  WeightType type = WeightType::kF32;

  bool empty() const { return data == nullptr; }
  // The matrix from element `elements` on (an expert of a stacked tensor).
  DeviceMatrix At(int64_t elements) const {
    const int64_t bytes = type == WeightType::kF32 ? 4 : 2;
    return DeviceMatrix{static_cast<const char*>(data) + elements * bytes, type};
  }
  // As the linear kernels take it.
  LinearWeights Linear(WeightLayout layout, int64_t ld, int64_t matrix_stride = 0) const {
    return LinearWeights{data, type, layout, ld, matrix_stride};
  }
};

// Router matrices ([n, d] in the model) are held transposed, [d, n]: the
// few-row product's lanes, one per output column, then read consecutive
// addresses at each k instead of rows d floats apart (linear.h, kKN).
struct DeviceAttentionWeights {
  DeviceMatrix q, k, v, o;
  const float* sel_v = nullptr;      // [d, n]
  const float* sel_o = nullptr;      // [d, n]
  const float* pos_to_pk = nullptr;  // XL positions: [H * dh, d]
};

struct DeviceFfnWeights {
  const float* router_w = nullptr;  // [d, X]
  const float* router_b = nullptr;
  DeviceMatrix w1, w2;
  const float* b1 = nullptr;
  const float* b2 = nullptr;
};

struct DeviceLayerWeights {
  const float* attn_norm_w = nullptr;
  const float* attn_norm_b = nullptr;
  const float* ffn_norm_w = nullptr;
  const float* ffn_norm_b = nullptr;
  DeviceAttentionWeights attn;
  DeviceFfnWeights ffn;
};

class DeviceWeights {
 public:
  // `weights` must match `config` (ValidateWeights). Errors: the device's
  // (RESOURCE_EXHAUSTED when it has no room); INVALID_ARGUMENT, naming the
  // tensor, for a finite value that rounding to bf16 makes infinite, unless
  // `allow_non_finite_weights` (ModelLoadOptions'): then the tensor is held
  // so, and a line naming it is appended to `warnings` (when not null).
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Upload(
      const ModelConfig& config, const ModelWeights& weights, WeightFormat format,
      bool allow_non_finite_weights = false, std::vector<std::string>* warnings = nullptr);

  const DeviceMatrix& embedding() const { return embedding_; }
  const DeviceMatrix& output_head() const { return output_head_; }
  const float* final_norm_w() const { return final_norm_w_; }
  const float* final_norm_b() const { return final_norm_b_; }
  const float* output_bias() const { return output_bias_; }  // [V] or null
  const DeviceLayerWeights& layer(int l) const { return layers_[l]; }
  // Device bytes the weights take.
  int64_t bytes() const { return bytes_; }

 private:
  DeviceWeights() = default;
  // A value bf16 cannot hold: INVALID_ARGUMENT "holds ..." or, with
  // `allow_non_finite`, the matrix with "holds ..." in `*problem` (Upload
  // names the tensor).
  absl::StatusOr<DeviceMatrix> Matrix(const Tensor& t, WeightFormat format, bool allow_non_finite,
                                      std::string* problem);
  absl::StatusOr<const float*> Floats(const Tensor& t);
  // A 2-D tensor [n, k] as f32 [k, n].
  absl::StatusOr<const float*> Transposed(const Tensor& t);
  // `values` in a new device buffer.
  absl::StatusOr<const float*> UploadFloats(const std::vector<float>& values);

  std::vector<DeviceBuffer> buffers_;
  DeviceMatrix embedding_, output_head_;
  const float* final_norm_w_ = nullptr;
  const float* final_norm_b_ = nullptr;
  const float* output_bias_ = nullptr;
  std::vector<DeviceLayerWeights> layers_;
  int64_t bytes_ = 0;
};

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_DEVICE_WEIGHTS_H_
