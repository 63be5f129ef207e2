#include "kernels/cpu/matmul.h"

#include "kernels/cpu/cpu_ops.h"

namespace switchserve::cpu {

void AddScaledProduct(const MatmulArgs& args, void (*kernel)(const MatmulArgs&)) {
  thread_local std::vector<float> product;
  const size_t n = static_cast<size_t>(args.n);
  if (product.size() < static_cast<size_t>(args.m) * n) product.resize(args.m * n);
  MatmulArgs plain = args;
  plain.c = product.data();
  plain.ldc = args.n;
  plain.c_rows = nullptr;
  plain.c_scale = nullptr;
  plain.accumulate = false;
  kernel(plain);
  for (int i = 0; i < args.m; ++i) {
    AddScaledRow(RowOfC(args, i), product.data() + i * n, args.c_scale[i], args.n);
  }
}

WeightMatrix MatrixOf(const Tensor& tensor, int64_t ld, int64_t offset) {
  WeightMatrix m;
  m.dtype = tensor.dtype();
  m.data = static_cast<const char*>(tensor.raw()) + offset * DTypeSize(tensor.dtype());
  m.ld = ld;
  return m;
}

namespace {

// Elements of one matrix of `rows` x `columns`, tiled.
int64_t TiledElements(int64_t rows, int64_t columns, Tiling tiling) {
  if (tiling == Tiling::kRowBlocks) {
    return (rows + kTileRows - 1) / kTileRows * kTileRows * ((columns + 7) / 8 * 8);
  }
  return (columns + kPanelColumns - 1) / kPanelColumns * kPanelColumns * rows;
}

// Element (r, c) of a tiled matrix of `rows` x `columns`.
int64_t TiledIndex(int64_t r, int64_t c, int64_t rows, int64_t columns, Tiling tiling) {
  if (tiling == Tiling::kRowBlocks) {
    return TiledOffset(r, (columns + 7) / 8 * 8) + c / 8 * 8 * kTileRows + c % 8;
  }
  return c / kPanelColumns * kPanelColumns * rows + r * kPanelColumns + c % kPanelColumns;
}

// Copies `matrices` row-major matrices of T from `in` into `tiling` at `out`
// (zeroed beforehand).
template <typename T>
void Tile(const T* in, int64_t matrices, int64_t rows, int64_t columns, Tiling tiling, T* out) {
  const int64_t tiled = TiledElements(rows, columns, tiling);
  for (int64_t m = 0; m < matrices; ++m) {
    const T* src = in + m * rows * columns;
    T* dst = out + m * tiled;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < columns; ++c) {
        dst[TiledIndex(r, c, rows, columns, tiling)] = src[r * columns + c];
      }
    }
  }
}

// The matrices of a tensor [..., rows, columns] and the elements each takes
// tiled: what a copy holds.
struct CopyShape {
  int64_t rows = 0, columns = 0;
  int64_t matrices = 0;
  int64_t matrix_elements = 0;
};

CopyShape CopyShapeOf(const Tensor& tensor, Tiling tiling) {
  const std::vector<int64_t>& shape = tensor.shape();
  CopyShape copy;
  copy.rows = shape[shape.size() - 2];
  copy.columns = shape.back();
  const int64_t elements = copy.rows * copy.columns;
  copy.matrices = elements > 0 ? tensor.numel() / elements : 0;
  copy.matrix_elements = TiledElements(copy.rows, copy.columns, tiling);
  return copy;
}

}  // namespace

TiledWeights::TiledWeights(const Tensor& tensor, Tiling tiling)
    : dtype_(tensor.dtype()), tiling_(tiling) {
  const CopyShape shape = CopyShapeOf(tensor, tiling);
  rows_ = shape.rows;
  columns_ = shape.columns;
  matrix_elements_ = shape.matrix_elements;
  ld_ = tiling == Tiling::kRowBlocks ? (columns_ + 7) / 8 * 8 : kPanelColumns * rows_;
  const size_t size = static_cast<size_t>(shape.matrices * matrix_elements_);
  if (dtype_ == DType::kF32) {
    f32_.assign(size, 0.0f);
    Tile(tensor.f32(), shape.matrices, rows_, columns_, tiling, f32_.data());
  } else {
    half_.assign(size, 0);
    Tile(tensor.half(), shape.matrices, rows_, columns_, tiling, half_.data());
  }
}

int64_t TiledWeights::BytesFor(const Tensor& tensor, Tiling tiling) {
  const CopyShape shape = CopyShapeOf(tensor, tiling);
  return shape.matrices * shape.matrix_elements * DTypeSize(tensor.dtype());
}

WeightMatrix TiledWeights::Matrix(int64_t offset) const {
  const int64_t row = offset / columns_;
  const int64_t matrix = row / rows_;
  WeightMatrix m;
  m.dtype = dtype_;
  const void* base = dtype_ == DType::kF32 ? static_cast<const void*>(f32_.data())
                                           : static_cast<const void*>(half_.data());
  m.data = static_cast<const char*>(base) + matrix * matrix_elements_ * DTypeSize(dtype_);
  m.ld = ld_;
  m.tiling = tiling_;
  return m.At(row % rows_, 0);
}

int64_t TiledWeights::bytes() const {
  return static_cast<int64_t>(f32_.size() * sizeof(float) + half_.size() * sizeof(uint16_t));
}

const MatmulKernels& KernelsFor(KernelIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == KernelIsa::kAvx2) return Avx2Kernels();
  if (isa == KernelIsa::kAvx512) return Avx512Kernels();
#endif
  return GenericKernels();
}

}  // namespace switchserve::cpu
