// The CPU backend's tiled copies of its weight matrices (matmul.h,
// TiledWeights), for the products of a single row: a batch-1 decode step
// reads every weight once, from memory, and a tiled matrix streams in order
// where the stored one gives a tile eight strided rows at a time (bf16
// rows-out, matmul_bench FromMemory, one row: 1.2-1.6x). Products of more
// rows read the tensors as stored, whose tiles reuse each weight across rows
// from the caches. Every layout gives the same bits, so which one a product
// reads changes no result.
#ifndef SWITCHSERVE_KERNELS_CPU_ONE_ROW_WEIGHTS_H_
#define SWITCHSERVE_KERNELS_CPU_ONE_ROW_WEIGHTS_H_

#include <cstdint>
#include <unordered_map>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "kernels/cpu/matmul.h"

namespace switchserve::cpu {

class OneRowWeights {
 public:
  // No copies: every product reads the tensors as stored.
  OneRowWeights() = default;
  // Tiled copies of the matrices a decode step multiplies (projections,
  // routers, experts, the output head) for `kernels`: rows-out ones in row
  // blocks where their rows are shorter than 4 KiB (longer ones stream as
  // fast as stored), rows-in ones in column panels unless `kernels` read
  // their rows whole at one row (MatmulKernels::one_row_whole_in_columns).
  OneRowWeights(const ModelConfig& config, const ModelWeights& weights,
                const MatmulKernels& kernels);

  // Bytes the copies of `weights`' tensors for `kernels` would take.
  static int64_t BytesFor(const ModelConfig& config, const ModelWeights& weights,
                          const MatmulKernels& kernels);

  // The matrix MatrixOf(tensor, ld, offset) for a product of `rows` rows: its
  // tiled copy for one row where there is one, else the tensor.
  WeightMatrix Matrix(const Tensor& tensor, int64_t ld, int64_t offset, int rows) const;

  int64_t bytes() const { return bytes_; }

 private:
  std::unordered_map<const Tensor*, TiledWeights> copies_;
  int64_t bytes_ = 0;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_ONE_ROW_WEIGHTS_H_
