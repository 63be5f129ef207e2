#include "kernels/cpu/one_row_weights.h"

#include <unordered_set>
#include <vector>

namespace switchserve::cpu {
namespace {

// Stored rows-out rows this long stream as fast as tiled ones: the hardware
// prefetcher follows each row in time. matmul_bench FromMemory, one row, AMD
// EPYC VM, medians of 8 interleaved repetitions: f32 rows of 4 KiB (k = 1024)
// 0.93-1.05 of the read bandwidth stored, 0.86-1.02 tiled; f32 rows of 512
// bytes 0.51-0.59 stored, 0.83-0.85 tiled; bf16 rows of 2 KiB 0.57-0.67
// stored, 0.70-0.86 tiled.
constexpr int64_t kMaxRowBlocksRowBytes = 4096;

int64_t RowBytes(const Tensor& t) { return t.shape().back() * DTypeSize(t.dtype()); }

// The tiling a copy of `t` gets for `kernels`, kNone for no copy. Rows-out
// matrices with rows under kMaxRowBlocksRowBytes go to row blocks. Rows-in
// matrices go to column panels: a product of one row takes 8 rows at a time
// across its columns, which for rows of 1 KiB or more are 8 strided streams,
// and for shorter ones wider than the kernels' one-row tile a block read
// twice, a part of each row per pass (matmul_bench FromMemory, one row, 8
// matrices, AMD EPYC Zen 3 VM, AVX2: the SwitchHead output experts [112,
// 1024] bf16 0.68 -> 0.94 of the read bandwidth, f32 0.79 -> 0.87; the value
// experts [1024, 112] bf16 0.76 -> 0.87, f32 0.68 -> 0.76). Short rows the
// kernels read whole stay as stored: their panels, padded to whole panels,
// read more bytes (the value experts with the AVX-512 kernels, Zen 4 VM,
// bf16, medians of 6 interleaved: 8 experts 48.0 us stored against 60.0 us
// tiled, one expert 7.8 against 10.8 us).
Tiling TilingOf(const Tensor& t, bool rows_in, const MatmulKernels& kernels) {
  if (t.empty() || t.shape().size() < 2) return Tiling::kNone;
  if (rows_in) {
    const bool read_whole =
        RowBytes(t) < kRowsInLongRowBytes && t.shape().back() <= kernels.one_row_whole_in_columns;
    return read_whole ? Tiling::kNone : Tiling::kColumnPanels;
  }
  return RowBytes(t) < kMaxRowBlocksRowBytes ? Tiling::kRowBlocks : Tiling::kNone;
}

// Every weight tensor a step multiplies (ModelWeights' layouts), and whether
// its matrices are rows-in: q, k, the routers, the FFN's and the output head
// rows-out; v and o rows-out where attention is not routed, rows-in where
// it is.
template <typename Fn>
void ForEachMatrix(const ModelConfig& config, const ModelWeights& weights, const Fn& fn) {
  const bool routed = config.attention.IsRouted();
  for (const LayerWeights& layer : weights.layers) {
    const AttentionWeights& a = layer.attn;
    for (const Tensor* t : {&a.q, &a.k, &a.sel_v, &a.sel_o}) fn(*t, false);
    fn(a.v, routed);
    fn(a.o, routed);
    const FfnWeights& f = layer.ffn;
    for (const Tensor* t : {&f.router_w, &f.w1, &f.w2}) fn(*t, false);
  }
  fn(weights.OutputHead(), false);
}

// Each tensor a copy is made of, once (a tensor may serve two roles), with
// its tiling.
template <typename Fn>
void ForEachCopy(const ModelConfig& config, const ModelWeights& weights,
                 const MatmulKernels& kernels, const Fn& fn) {
  std::unordered_set<const Tensor*> seen;
  ForEachMatrix(config, weights, [&](const Tensor& t, bool rows_in) {
    const Tiling tiling = TilingOf(t, rows_in, kernels);
    if (tiling != Tiling::kNone && seen.insert(&t).second) fn(t, tiling);
  });
}

}  // namespace

OneRowWeights::OneRowWeights(const ModelConfig& config, const ModelWeights& weights,
                             const MatmulKernels& kernels) {
  ForEachCopy(config, weights, kernels, [this](const Tensor& t, Tiling tiling) {
    bytes_ += copies_.emplace(&t, TiledWeights(t, tiling)).first->second.bytes();
  });
}

int64_t OneRowWeights::BytesFor(const ModelConfig& config, const ModelWeights& weights,
                                const MatmulKernels& kernels) {
  int64_t bytes = 0;
  ForEachCopy(config, weights, kernels,
              [&](const Tensor& t, Tiling tiling) { bytes += TiledWeights::BytesFor(t, tiling); });
  return bytes;
}

WeightMatrix OneRowWeights::Matrix(const Tensor& tensor, int64_t ld, int64_t offset,
                                   int rows) const {
  if (rows == 1) {
    const auto it = copies_.find(&tensor);
    if (it != copies_.end()) return it->second.Matrix(offset);
  }
  return MatrixOf(tensor, ld, offset);
}

}  // namespace switchserve::cpu
