#include "kernels/cpu/matmul.h"

namespace switchserve::cpu {

std::string_view ToString(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kGeneric:
      return "generic";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool CpuSupports(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kGeneric:
      return true;
    case KernelIsa::kAvx2:
#if defined(__x86_64__) || defined(__i386__)
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case KernelIsa::kAvx512:
#if defined(__x86_64__) || defined(__i386__)
      return CpuSupports(KernelIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
  }
  return false;
}

std::vector<KernelIsa> SupportedKernelIsas() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

KernelIsa BestKernelIsa() {
  if (CpuSupports(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  return CpuSupports(KernelIsa::kAvx2) ? KernelIsa::kAvx2 : KernelIsa::kGeneric;
}

WeightMatrix MatrixOf(const Tensor& tensor, int64_t ld, int64_t offset) {
  WeightMatrix m;
  m.dtype = tensor.dtype();
  m.data = static_cast<const char*>(tensor.raw()) + offset * DTypeSize(tensor.dtype());
  m.ld = ld;
  return m;
}

namespace {

// Copies `matrices` row-major [n, k] matrices of T from `in` into the tiled
// layout at `out` (zeroed beforehand): `rows` rows and `ld` columns each.
template <typename T>
void Tile(const T* in, int64_t matrices, int64_t n, int64_t k, int64_t rows, int64_t ld, T* out) {
  for (int64_t m = 0; m < matrices; ++m) {
    const T* src = in + m * n * k;
    T* dst = out + m * rows * ld;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        dst[TiledOffset(r, ld) + c / 8 * 8 * kTileRows + c % 8] = src[r * k + c];
      }
    }
  }
}

}  // namespace

TiledWeights::TiledWeights(const Tensor& tensor) : dtype_(tensor.dtype()) {
  const std::vector<int64_t>& shape = tensor.shape();
  n_ = shape[shape.size() - 2];
  k_ = shape.back();
  ld_ = (k_ + 7) / 8 * 8;
  rows_ = (n_ + kTileRows - 1) / kTileRows * kTileRows;
  const int64_t matrices = n_ * k_ > 0 ? tensor.numel() / (n_ * k_) : 0;
  const size_t size = static_cast<size_t>(matrices * rows_ * ld_);
  if (dtype_ == DType::kF32) {
    f32_.assign(size, 0.0f);
    Tile(tensor.f32(), matrices, n_, k_, rows_, ld_, f32_.data());
  } else {
    half_.assign(size, 0);
    Tile(tensor.half(), matrices, n_, k_, rows_, ld_, half_.data());
  }
}

WeightMatrix TiledWeights::Matrix(int64_t offset) const {
  const int64_t row = offset / k_;
  const int64_t matrix = row / n_;
  WeightMatrix m;
  m.dtype = dtype_;
  const void* base = dtype_ == DType::kF32 ? static_cast<const void*>(f32_.data())
                                           : static_cast<const void*>(half_.data());
  m.data = static_cast<const char*>(base) + matrix * rows_ * ld_ * DTypeSize(dtype_);
  m.ld = ld_;
  m.tiled = true;
  m.first_row = row % n_;
  return m;
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
