// Elementwise and row-wise building blocks of the CPU backend: norms,
// activations, RoPE, the weighted sum of expert output rows, scratch buffers.
// Internal to the CPU backend; no state beyond the RoPE table, no allocation
// per call. Every function works row by row: a row's result never depends on
// the other rows.
#ifndef SWITCHSERVE_KERNELS_CPU_CPU_OPS_H_
#define SWITCHSERVE_KERNELS_CPU_CPU_OPS_H_

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/moe/expert_dispatch.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {

// Grows a scratch buffer to at least `n` elements (never shrinks it, so a
// buffer reused across steps allocates only when a step is larger than any
// before).
template <typename T>
void Grow(std::vector<T>& buffer, size_t n) {
  if (buffer.size() < n) buffer.resize(n);
}

// The f32 tensor's values from `offset` on, or null for an absent tensor (a
// bias the config does not call for).
inline const float* F32OrNull(const Tensor& t, int64_t offset = 0) {
  return t.empty() ? nullptr : t.f32() + offset;
}

// out[0, count) = elements [offset, offset + count) of `t`, widened to f32.
void WidenValues(const Tensor& t, int64_t offset, int count, float* out);

// Calls fn(begin, end) on consecutive ranges that cover the rows [0, rows):
// shared out on `pool` when the work (`values`, in the caller's unit) is at
// least `parallel_min_values` and there are two rows or more, else once on
// the calling thread. For row-wise work, whose rows do not depend on each
// other: how the rows are split changes no result.
template <typename Fn>
void ForRowRanges(WorkerPool* pool, int rows, int64_t values, int64_t parallel_min_values,
                  const Fn& fn) {
  if (pool->threads() == 1 || values < parallel_min_values || rows < 2) {
    fn(0, rows);
    return;
  }
  const int pieces = rows < 4 * pool->threads() ? rows : 4 * pool->threads();
  pool->Run(pieces, [&](int i, int) {
    fn(static_cast<int>(static_cast<int64_t>(rows) * i / pieces),
       static_cast<int>(static_cast<int64_t>(rows) * (i + 1) / pieces));
  });
}

// out[r] = Norm(x[r]) for `rows` rows of width d (stride d). `bias` may be
// null (RMSNorm has none).
void NormRows(NormKind kind, float eps, const float* x, int rows, int d, const float* weight,
              const float* bias, float* out);
// The same, rows shared out on `pool` (ForRowRanges) when rows x d is at
// least `parallel_min_values`.
void NormRows(NormKind kind, float eps, const float* x, int rows, int d, const float* weight,
              const float* bias, float* out, WorkerPool* pool, int64_t parallel_min_values);

// x[r, :] += bias for `rows` rows of width n with stride ld.
void AddBiasRows(float* x, int rows, int n, int ld, const float* bias);
void ApplyActivation(Activation act, float* x, int64_t n);
float Sigmoid(float z);

// row[0, n) += weight * product[0, n): one multiply and one add per element.
void AddScaledRow(float* row, const float* product, float weight, int n);

// One router's expert outputs, for AddExpertOutputs: its assignments, the
// product rows of its slots (slot s at product + s * width) and the rows of
// its tokens (token t at dst + t * dst_stride).
struct ExpertOutputs {
  const ExpertAssignments* assignments;
  const float* product;
  float* dst;
  int64_t dst_stride;
};
// For every token row: += each of its slots' gate weight * product row, in
// `groups` order, within a group by expert then slot, one multiply and one
// add per element. Token rows are shared out on `pool` when there are at
// least `parallel_min_values` products to add; the order of the additions
// into a row never changes.
void AddExpertOutputs(const std::vector<ExpertOutputs>& groups, int width, int tokens,
                      WorkerPool* pool, int64_t parallel_min_values);
// The same for token rows [t_begin, t_end) only, on the calling thread (a
// piece of a caller's own job over token rows). `from_zero`: each group's
// token rows are set to zero first instead of added to.
void AddExpertOutputRows(const std::vector<ExpertOutputs>& groups, int width, int t_begin,
                         int t_end, bool from_zero);

// Rotate-half RoPE on the first n_rot channels of a head vector, cos/sin
// tabulated for positions [0, positions()). The table grows with the
// positions a step uses (Reserve), not with the model's context length: a
// config's max_seq_len allocates nothing by itself.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(int n_rot, double base) : n_rot_(n_rot), base_(base) {}
  int n_rot() const { return n_rot_; }
  int positions() const { return positions_; }
  // Tabulates positions [0, positions) (those already there are kept).
  void Reserve(int positions);
  // Rotates `heads` consecutive head vectors of size head_dim at `position`,
  // which must be below positions().
  void Apply(float* x, int heads, int head_dim, int position) const;

 private:
  int n_rot_ = 0;
  double base_ = 10000.0;
  int positions_ = 0;
  std::vector<float> cos_;  // [positions, n_rot / 2]
  std::vector<float> sin_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_CPU_OPS_H_
