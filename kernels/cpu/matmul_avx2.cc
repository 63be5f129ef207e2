// The kernels of matmul.h for AVX2 + FMA + F16C (16 vector registers).
//
// The standard and intrinsics headers come first, compiled for the baseline;
// the target pragma then applies to the kernels defined after it only, so no
// out-of-line copy of an inline library function can carry AVX2 instructions
// into code that runs on any CPU.
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace switchserve::cpu {
namespace {

struct Tiles {
  static constexpr int kOutRows = 4;  // 12 accumulators, 3 weight vectors, 1 input
  static constexpr int kOutCols = 3;
  static constexpr int kOneRowOutCols = 8;
  static constexpr int kInRows = 4;  // 12 accumulators, 3 weight vectors, 1 broadcast
  static constexpr int kInVectors = 3;
  static constexpr int kOneRowInVectors = 8;
  static constexpr int kOneRowShortInVectors = 8;
};

}  // namespace
}  // namespace switchserve::cpu

#include "kernels/cpu/matmul_x86_kernels.h"

namespace switchserve::cpu {

const MatmulKernels& Avx2Kernels() { return X86Kernels(); }

}  // namespace switchserve::cpu

#pragma GCC pop_options
