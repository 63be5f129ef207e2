// Transformer-XL relative positions (attention.position "xl") in the CPU
// backend: the position keys of every layer, tabulated once when the backend
// is created, and the position term of an attention score.
//
// The math (docs/model-format.md): with s = 1/sqrt(dh), q_i and k_j scaled by
// s^1/2 = dh^-1/4 and unrotated,
//   score_h(i, j) = q_{i,h} . k_{j,g(h)}  +  q_{i,h} . R_h[i - j]       (j <= i)
//   R_h[delta]    = pos_to_pk[h*dh : (h+1)*dh] . (dh^-1/4 * pe(-delta))
//   pe(p)[2m] = sin(p * w_m),  pe(p)[2m+1] = cos(p * w_m),  w_m = 10000^(-2m/d)
// where i, j are absolute positions in the sequence, so a full pass, chunked
// prefill and decoding see the same R_h[i - j].
//
// Table layout, one per layer: f32 [H, max_seq_len, dh]; R_h[delta] is the dh
// floats at (h * max_seq_len + delta) * dh. pe and the product with pos_to_pk
// are computed in double and rounded once to f32. A query at position i walks
// R_h[i], R_h[i - 1], ..., R_h[0] for keys j = 0, 1, ..., i: one head's table
// is contiguous.
//
// The position term q . R_h[i - j] is a dot8 of matmul.h, added to the
// score's q . k_j in the one operation order of paged_attention.h: bitwise
// the same however the sequence is chunked and whatever else is in the step.
// Internal to the CPU backend.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_XL_POSITIONS_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_XL_POSITIONS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace switchserve::cpu {

// One layer's table: R_h[delta] is the dh floats at (h * positions + delta) *
// dh of `keys`. Null `keys`: the model uses RoPE.
struct XlPositionKeys {
  const float* keys = nullptr;
  int positions = 0;  // max_seq_len: delta in [0, positions)
  int head_dim = 0;

  explicit operator bool() const { return keys != nullptr; }
  const float* At(int head, int delta) const {
    return keys + (static_cast<int64_t>(head) * positions + delta) * head_dim;
  }
};

class XlPositionTable {
 public:
  // An empty table (RoPE models have none).
  XlPositionTable() = default;

  // Bytes the tables of `config` take: n_layers * H * max_seq_len * dh * 4;
  // -1 when that does not fit in int64. 0 for RoPE models.
  static int64_t BytesFor(const ModelConfig& config);

  // Tabulates every layer's R from `weights` (which must match `config`).
  // RESOURCE_EXHAUSTED, naming the size and its factors, when the tables
  // would take more than `max_bytes` or cannot be allocated. An empty table
  // for RoPE models.
  static absl::StatusOr<XlPositionTable> Create(const ModelConfig& config,
                                                const ModelWeights& weights, int64_t max_bytes);

  bool empty() const { return layers_.empty(); }
  int max_positions() const { return max_positions_; }
  // Layer `layer`'s table, [H, max_seq_len, dh]; null keys when empty.
  XlPositionKeys Layer(int layer) const {
    if (layers_.empty()) return {};
    return {layers_[layer].data(), max_positions_, head_dim_};
  }

 private:
  int max_positions_ = 0;
  int head_dim_ = 0;
  std::vector<std::vector<float>> layers_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_XL_POSITIONS_H_
