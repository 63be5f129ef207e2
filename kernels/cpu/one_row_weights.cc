#include "kernels/cpu/one_row_weights.h"

#include <vector>

namespace switchserve::cpu {
namespace {

// Stored rows this long stream as fast as tiled ones: the hardware
// prefetcher follows each row in time. matmul_bench FromMemory, one row, AMD
// EPYC VM, medians of 8 interleaved repetitions: f32 rows of 4 KiB (k = 1024)
// 0.93-1.05 of the read bandwidth stored, 0.86-1.02 tiled; f32 rows of 512
// bytes 0.51-0.59 stored, 0.83-0.85 tiled; bf16 rows of 2 KiB 0.57-0.67
// stored, 0.70-0.86 tiled.
constexpr int64_t kMaxTiledRowBytes = 4096;

bool Tiles(const Tensor& t) {
  return !t.empty() && t.shape().size() >= 2 &&
         t.shape().back() * DTypeSize(t.dtype()) < kMaxTiledRowBytes;
}

// Every rows-out weight tensor a step multiplies (ModelWeights' layouts): q,
// k, the routers; v and o where attention is not routed (routed, theirs are
// rows-in); the FFN's; the output head.
template <typename Fn>
void ForEachRowsOut(const ModelConfig& config, const ModelWeights& weights, const Fn& fn) {
  const bool routed = config.attention.IsRouted();
  for (const LayerWeights& layer : weights.layers) {
    const AttentionWeights& a = layer.attn;
    for (const Tensor* t : {&a.q, &a.k, &a.sel_v, &a.sel_o}) fn(*t);
    if (!routed) {
      fn(a.v);
      fn(a.o);
    }
    const FfnWeights& f = layer.ffn;
    for (const Tensor* t : {&f.router_w, &f.w1, &f.w2}) fn(*t);
  }
  fn(weights.OutputHead());
}

int64_t TiledBytes(const Tensor& t) {
  const std::vector<int64_t>& shape = t.shape();
  const int64_t n = shape[shape.size() - 2], k = shape.back();
  const int64_t matrices = n * k > 0 ? t.numel() / (n * k) : 0;
  return matrices * ((n + kTileRows - 1) / kTileRows * kTileRows) * ((k + 7) / 8 * 8) *
         DTypeSize(t.dtype());
}

}  // namespace

OneRowWeights::OneRowWeights(const ModelConfig& config, const ModelWeights& weights) {
  ForEachRowsOut(config, weights, [this](const Tensor& t) { Add(t); });
}

int64_t OneRowWeights::BytesFor(const ModelConfig& config, const ModelWeights& weights) {
  int64_t bytes = 0;
  ForEachRowsOut(config, weights, [&](const Tensor& t) {
    if (Tiles(t)) bytes += TiledBytes(t);
  });
  return bytes;
}

void OneRowWeights::Add(const Tensor& tensor) {
  if (!Tiles(tensor) || copies_.count(&tensor) > 0) return;
  const TiledWeights& copy = copies_.emplace(&tensor, TiledWeights(tensor)).first->second;
  bytes_ += copy.bytes();
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
