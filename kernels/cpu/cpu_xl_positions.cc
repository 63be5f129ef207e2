#include "kernels/cpu/cpu_xl_positions.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"

namespace switchserve::cpu {
namespace {

// Relative distances tabulated per dgemm call (bounds the double scratch).
constexpr int kDistanceBlock = 256;

}  // namespace

int64_t XlPositionTable::BytesFor(const ModelConfig& config) {
  if (!config.attention.IsXl()) return 0;
  int64_t bytes = sizeof(float);
  for (int64_t factor :
       {config.n_layers, config.attention.n_heads, config.max_seq_len, config.attention.head_dim}) {
    if (__builtin_mul_overflow(bytes, factor, &bytes)) return -1;
  }
  return bytes;
}

absl::StatusOr<XlPositionTable> XlPositionTable::Create(const ModelConfig& config,
                                                        const ModelWeights& weights,
                                                        int64_t max_bytes) {
  XlPositionTable table;
  if (!config.attention.IsXl()) return table;
  const int H = config.attention.n_heads, dh = config.attention.head_dim;
  const int d = config.d_model, positions = config.max_seq_len;
  const int64_t bytes = BytesFor(config);
  const std::string size_text =
      absl::StrCat("n_layers ", config.n_layers, " x n_heads ", H, " x max_seq_len ", positions,
                   " x head_dim ", dh, " x 4 bytes");
  if (bytes < 0 || bytes > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "XL position table: ", size_text, " = ",
        bytes < 0 ? std::string("more than 2^63") : absl::StrCat(bytes), " bytes, more than the ",
        max_bytes, " bytes allowed (a smaller max_seq_len in config.json shrinks it)"));
  }
  const int64_t per_layer = static_cast<int64_t>(H) * positions * dh;
  const int64_t width = static_cast<int64_t>(H) * dh;  // one row of R: every head
  std::vector<double> pe, pos_to_pk, keys;
  try {
    table.layers_.resize(config.n_layers);
    for (std::vector<float>& layer : table.layers_) layer.resize(per_layer);
    pe.resize(static_cast<size_t>(kDistanceBlock) * d);
    pos_to_pk.resize(width * d);
    keys.resize(kDistanceBlock * width);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("XL position table: cannot allocate ", size_text, " = ", bytes, " bytes"));
  }
  table.max_positions_ = positions;
  table.head_dim_ = dh;

  // w_m = exp(2m * -ln(10000) / d), the training code's formula, in double.
  std::vector<double> frequency(d / 2);
  for (int m = 0; m < d / 2; ++m) {
    frequency[m] = std::exp(static_cast<double>(2 * m) * (-std::log(10000.0) / d));
  }
  const double scale = std::pow(static_cast<double>(dh), -0.25);
  for (int l = 0; l < config.n_layers; ++l) {
    const Tensor& p = weights.layers[l].attn.pos_to_pk;  // [H*dh, d], held in f32
    std::copy(p.f32(), p.f32() + p.size(), pos_to_pk.begin());
    float* out = table.layers_[l].data();
    for (int first = 0; first < positions; first += kDistanceBlock) {
      const int n = std::min(kDistanceBlock, positions - first);
      // pe(-delta) scaled by dh^-1/4, for delta = first .. first + n - 1.
      for (int i = 0; i < n; ++i) {
        const double relative = -static_cast<double>(first + i);
        for (int m = 0; m < d / 2; ++m) {
          pe[static_cast<size_t>(i) * d + 2 * m] = scale * std::sin(relative * frequency[m]);
          pe[static_cast<size_t>(i) * d + 2 * m + 1] = scale * std::cos(relative * frequency[m]);
        }
      }
      // keys[i, h*dh + c] = pos_to_pk[h*dh + c, :] . pe[i, :]
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(width), d, 1.0,
                  pe.data(), d, pos_to_pk.data(), d, 0.0, keys.data(), static_cast<int>(width));
      for (int i = 0; i < n; ++i) {
        for (int h = 0; h < H; ++h) {
          const double* src = keys.data() + i * width + static_cast<int64_t>(h) * dh;
          float* dst = out + (static_cast<int64_t>(h) * positions + first + i) * dh;
          for (int c = 0; c < dh; ++c) dst[c] = static_cast<float>(src[c]);
        }
      }
    }
  }
  return table;
}

}  // namespace switchserve::cpu
