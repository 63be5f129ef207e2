// The kernels of matmul.h in plain C++, for CPUs without AVX2/FMA: the
// operation order of matmul.h with separate multiplies and adds (this file is
// compiled with -ffp-contract=off, so the compiler fuses none).
#include <algorithm>

#include "kernels/cpu/matmul.h"

namespace switchserve::cpu {
namespace {

template <DType WT>
float Widen(const void* base, int64_t index) {
  if constexpr (WT == DType::kF32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (WT == DType::kBF16) {
    return BFloat16ToFloat(static_cast<const uint16_t*>(base)[index]);
  } else {
    return HalfToFloat(static_cast<const uint16_t*>(base)[index]);
  }
}

// dot8 of matmul.h, of `a` and row j of w (in either layout).
template <DType WT>
float Dot8(const float* a, const WeightMatrix& w, int64_t j, int k) {
  const bool blocks = w.tiling == Tiling::kRowBlocks;
  const int64_t row = blocks ? TiledOffset(w.first + j, w.ld) : j * w.ld;
  // Elements from one group of 8 of the row to the next.
  const int64_t group = blocks ? 8 * kTileRows : 8;
  float lane[8] = {};
  int p = 0;
  for (; p + 8 <= k; p += 8) {
    const int64_t at = row + p / 8 * group;
    for (int l = 0; l < 8; ++l) lane[l] += a[p + l] * Widen<WT>(w.data, at + l);
  }
  if (p < k) {
    // The zero-padded last group: lanes past k add a zero product.
    const int64_t at = row + p / 8 * group;
    for (int l = 0; l < 8; ++l) {
      const float product = p + l < k ? a[p + l] * Widen<WT>(w.data, at + l) : 0.0f;
      lane[l] += product;
    }
  }
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

template <DType WT>
void RowsOut(const MatmulArgs& g) {
  if (g.c_scale != nullptr) return AddScaledProduct(g, RowsOut<WT>);
  for (int i = 0; i < g.m; ++i) {
    const float* a = RowOfA(g, i);
    float* c = g.c + i * g.ldc;
    for (int j = 0; j < g.n; ++j) {
      const float r = g.alpha * Dot8<WT>(a, g.w, j, g.k);
      c[j] = g.accumulate ? c[j] + r : r;
    }
  }
}

template <DType WT>
void RowsIn(const MatmulArgs& g) {
  if (g.w.tiling == Tiling::kColumnPanels) return ForEachPanel(g, RowsIn<WT>);
  if (g.c_scale != nullptr) return AddScaledProduct(g, RowsIn<WT>);
  constexpr int kColumns = 64;  // accumulators kept per row while p runs
  float acc[kColumns];
  for (int i = 0; i < g.m; ++i) {
    const float* a = RowOfA(g, i);
    float* c = g.c + i * g.ldc;
    for (int j0 = 0; j0 < g.n; j0 += kColumns) {
      const int width = std::min(kColumns, g.n - j0);
      for (int j = 0; j < width; ++j) acc[j] = g.accumulate ? c[j0 + j] : 0.0f;
      for (int p = 0; p < g.k; ++p) {
        const float ap = a[p];
        const int64_t row = p * g.w.ld + j0;
        for (int j = 0; j < width; ++j) acc[j] += ap * Widen<WT>(g.w.data, row + j);
      }
      for (int j = 0; j < width; ++j) c[j0 + j] = acc[j];
    }
  }
}

}  // namespace

const MatmulKernels& GenericKernels() {
  static constexpr MatmulKernels kKernels = {
      &ByDtype<RowsOut<DType::kF32>, RowsOut<DType::kBF16>, RowsOut<DType::kF16>>,
      &ByDtype<RowsIn<DType::kF32>, RowsIn<DType::kBF16>, RowsIn<DType::kF16>>,
      0,
  };
  return kKernels;
}

}  // namespace switchserve::cpu
