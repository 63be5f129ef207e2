// The CPU backend's matrix products, written so that every output element is
// computed by the same sequence of floating-point operations whatever the
// number of rows, the row's place among them, the column range a call covers
// and the thread that runs it. That is what makes a request's logits
// independent of its neighbours in a step (docs/design.md, "Isolation").
//
// Two products, named after the layout of the weight matrix W (stored f32,
// bf16 or f16; half-precision values are widened to f32 exactly, in
// registers or in a thread-local tile, never at load):
//
//   MatmulRowsOut  W [n, k] (nn.Linear): c[i][j] = alpha * dot8(a[i, :], W[j, :])
//                  (+ c[i][j] when accumulating). dot8: eight lanes, lane l
//                  accumulating a[p] * w[p] for p = l (mod 8) in increasing p
//                  with fused multiply-adds (the last partial group of eight
//                  zero-padded), then the lanes summed as
//                  ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
//   MatmulRowsIn   W [k, n]: c[i][j] = a chain of fused multiply-adds over p
//                  in increasing order, acc = fma(a[i][p], W[p][j], acc),
//                  starting from c[i][j] when accumulating, else from 0.
//                  Accumulating calls over consecutive p ranges therefore give
//                  the same bits as one call over their union (attention uses
//                  this to reduce over keys block by block).
//
// The kernels come in instruction-set builds (KernelIsa); a backend picks one
// at creation and uses it for every call, so a configuration never mixes
// them. The builds differ in speed and, for kGeneric, in rounding (it
// multiplies and adds without fusing: a CPU without FMA has no other exact
// choice; kAvx2 and kAvx512 give the same bits); within one build the order
// above is fixed.
#ifndef SWITCHSERVE_KERNELS_CPU_MATMUL_H_
#define SWITCHSERVE_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/model/dtype.h"
#include "engine/model/huge_pages.h"
#include "engine/model/model_weights.h"
#include "kernels/cpu/kernel_isa.h"

namespace switchserve::cpu {

// A weight matrix as the kernels read it, in one of three layouts.
//
// Row-major (Tiling::kNone): element (r, c) at data + r * ld + c (in
// elements of `dtype`: F32, BF16 or F16), as stored in a Tensor.
//
// Row blocks (MatmulRowsOut weights, TiledWeights below): rows in blocks of
// kTileRows and each block's row length in groups of 8, the block's rows'
// groups side by side: element (r, c) at data + TiledOffset(r, ld) +
// (c / 8) * 8 * kTileRows + c % 8, with ld the row length rounded up to a
// multiple of 8 and every padding element zero. One row's product then reads
// a block of weights as one sequential stream rather than kTileRows strided
// ones. `first` is the row the matrix starts at (At), which need not start a
// block.
//
// Column panels (MatmulRowsIn weights): the columns in panels of
// kPanelColumns, each panel row-major with rows of kPanelColumns elements
// (the last one zero-padded), one panel after the other, `ld` elements
// apart: element (r, c) at data + (c / kPanelColumns) * ld + r *
// kPanelColumns + c % kPanelColumns, for columns c from `first` on. One
// row's product then reads each panel as one stream.
//
// The kernels multiply and add the same elements in the same order in every
// layout, so all give the same bits.
inline constexpr int kTileRows = 8;
inline constexpr int kPanelColumns = 64;

enum class Tiling { kNone, kRowBlocks, kColumnPanels };

struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t ld = 0;
  Tiling tiling = Tiling::kNone;
  int64_t first = 0;  // row blocks: the first row; column panels: the first column

  // The matrix starting at element (row, column) of this one; a matrix in
  // row blocks is never split across its rows' length, so its column must
  // be 0.
  WeightMatrix At(int64_t row, int64_t column) const {
    WeightMatrix out = *this;
    switch (tiling) {
      case Tiling::kNone:
        out.data = static_cast<const char*>(data) + (row * ld + column) * DTypeSize(dtype);
        break;
      case Tiling::kRowBlocks:
        out.first += row;
        break;
      case Tiling::kColumnPanels:
        out.data = static_cast<const char*>(data) + row * kPanelColumns * DTypeSize(dtype);
        out.first += column;
        break;
    }
    return out;
  }
};

// Elements from a tiled matrix's data to the first group of its row r.
inline int64_t TiledOffset(int64_t r, int64_t ld) {
  return r / kTileRows * kTileRows * ld + r % kTileRows * 8;
}

// The tensor from its flat element `offset` on, with leading dimension `ld`.
WeightMatrix MatrixOf(const Tensor& tensor, int64_t ld, int64_t offset = 0);

// A tensor of weight matrices [..., rows, columns] copied into row blocks
// (rows-out weights: rows rounded up to whole blocks, columns to groups of 8)
// or column panels (rows-in weights: columns rounded up to whole panels), each
// matrix on its own, on huge pages.
class TiledWeights {
 public:
  TiledWeights() = default;
  // `tensor` must have at least two dimensions; `tiling` is not kNone.
  TiledWeights(const Tensor& tensor, Tiling tiling);

  // The matrix MatrixOf(tensor, columns, offset) reads, tiled: `offset` must
  // be a whole number of rows.
  WeightMatrix Matrix(int64_t offset = 0) const;
  int64_t bytes() const;
  // Bytes a copy of `tensor` in `tiling` takes.
  static int64_t BytesFor(const Tensor& tensor, Tiling tiling);

 private:
  DType dtype_ = DType::kF32;
  Tiling tiling_ = Tiling::kRowBlocks;
  int64_t rows_ = 0, columns_ = 0;  // of each matrix, as stored
  int64_t matrix_elements_ = 0;     // of each matrix, tiled
  int64_t ld_ = 0;                  // WeightMatrix::ld
  HugePageVector<float> f32_;
  HugePageVector<uint16_t> half_;
};

struct MatmulArgs {
  int m = 0;  // rows of a and c
  int n = 0;  // columns of c
  int k = 0;  // the reduced dimension
  const float* a = nullptr;
  int64_t lda = 0;
  // When set, row i of `a` is a + a_rows[i] * lda (the rows a router sent
  // to one expert, read in place); else a + i * lda.
  const int32_t* a_rows = nullptr;
  WeightMatrix w;  // [n, k] for MatmulRowsOut, [k, n] for MatmulRowsIn
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;       // MatmulRowsOut only
  bool accumulate = false;  // see the top of this file
  // When set, the product (as computed without accumulating; `accumulate`
  // unused) is added to c scaled by its row, one multiply and one add:
  //   c[i][j] = c[i][j] + c_scale[i] * product[i][j]
  // with row i of c at c + c_rows[i] * ldc (c_rows must be set too): an
  // expert's gated outputs added to its tokens' rows, as AddScaledRow adds
  // them. The AVX-512 build's many-row rows-in tiles add from their registers
  // where all of k fits one pass; other products go through a per-thread
  // buffer (AddScaledProduct), with the same bits.
  const float* c_scale = nullptr;
  const int32_t* c_rows = nullptr;
};

// c's row i, where c_rows is set or not.
inline float* RowOfC(const MatmulArgs& args, int i) {
  return args.c + (args.c_rows != nullptr ? args.c_rows[i] : i) * args.ldc;
}

// A scaled product (args.c_scale set) by `kernel` into a per-thread buffer,
// then added to c's rows, one multiply and one add per element.
void AddScaledProduct(const MatmulArgs& args, void (*kernel)(const MatmulArgs&));

// Calls fn(args) for each column panel's part of a column-panels product
// `g`, as a row-major product over that panel.
template <typename Fn>
void ForEachPanel(const MatmulArgs& g, const Fn& fn) {
  int64_t column = g.w.first;
  for (int j = 0; j < g.n;) {
    const int64_t within = column % kPanelColumns;
    const int width =
        static_cast<int>(g.n - j < kPanelColumns - within ? g.n - j : kPanelColumns - within);
    MatmulArgs panel = g;
    panel.n = width;
    panel.c = g.c + j;
    panel.w.data = static_cast<const char*>(g.w.data) +
                   (column / kPanelColumns * g.w.ld + within) * DTypeSize(g.w.dtype);
    panel.w.ld = kPanelColumns;
    panel.w.tiling = Tiling::kNone;
    panel.w.first = 0;
    fn(panel);
    j += width;
    column += width;
  }
}

// A MatmulRowsIn call of a few rows whose columns span at least this many
// bytes of weights takes 8 weight rows at a time across all its columns, so
// that the weights stream in order; MatmulRunner makes its pieces this wide
// where the matrix allows enough of them.
constexpr int64_t kRowsInLongRowBytes = 1024;

// One build of the kernels. Each function computes all of args' m x n block
// on the calling thread; callers split work over rows or columns (never over
// k), which changes no element's operations.
struct MatmulKernels {
  void (*rows_out)(const MatmulArgs& args);
  void (*rows_in)(const MatmulArgs& args);
  // A rows_in product of one row reads each weight row whole, in one pass
  // over the matrix, where the rows are at most this many columns and
  // shorter than kRowsInLongRowBytes (0: never).
  int one_row_whole_in_columns;
};
// `isa` must be supported by this CPU (CpuSupports).
const MatmulKernels& KernelsFor(KernelIsa isa);

// A build's entry for all three weight dtypes: calls the kernel for
// args.w.dtype, or none for an empty block.
template <void (*F32)(const MatmulArgs&), void (*BF16)(const MatmulArgs&),
          void (*F16)(const MatmulArgs&)>
void ByDtype(const MatmulArgs& args) {
  if (args.m <= 0 || args.n <= 0) return;
  switch (args.w.dtype) {
    case DType::kBF16:
      return BF16(args);
    case DType::kF16:
      return F16(args);
    default:
      return F32(args);
  }
}

// Row i of args.a.
inline const float* RowOfA(const MatmulArgs& args, int i) {
  return args.a + (args.a_rows != nullptr ? args.a_rows[i] : i) * args.lda;
}

// The builds, for KernelsFor (matmul_generic.cc, matmul_avx2.cc,
// matmul_avx512.cc).
const MatmulKernels& GenericKernels();
const MatmulKernels& Avx2Kernels();
const MatmulKernels& Avx512Kernels();

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_MATMUL_H_
