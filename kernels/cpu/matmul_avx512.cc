// The kernels of matmul.h with AVX-512's 32 vector registers: the same
// operations as matmul_avx2.cc, in the same order for every element
// (identical results), with larger register tiles, and for many rows 16-lane
// tiles (SWITCHSERVE_MATMUL_ZMM) that carry two 8-lane accumulators or 16
// columns' chains per register.
//
// The standard and intrinsics headers come first, compiled for the baseline;
// the target pragma then applies to the kernels defined after it only.
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl")

#define SWITCHSERVE_MATMUL_ZMM 1

namespace switchserve::cpu {
namespace {

struct Tiles {
  static constexpr int kOutRows = 4;  // 16 accumulators, 4 weight vectors, 1 input
  static constexpr int kOutCols = 4;
  static constexpr int kOneRowOutCols = 8;
  static constexpr int kInRows = 6;  // 24 accumulators, 4 weight vectors, 1 broadcast
  static constexpr int kInVectors = 4;
  static constexpr int kOneRowInVectors = 8;
  static constexpr int kOneRowShortInVectors = 16;
};

}  // namespace
}  // namespace switchserve::cpu

#include "kernels/cpu/matmul_x86_kernels.h"

namespace switchserve::cpu {

const MatmulKernels& Avx512Kernels() { return X86Kernels(); }

}  // namespace switchserve::cpu

#undef SWITCHSERVE_MATMUL_ZMM

#pragma GCC pop_options
