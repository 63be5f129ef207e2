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
#include "engine/model/model_weights.h"

namespace switchserve::cpu {

enum class KernelIsa {
  kGeneric,  // any x86-64 (or other) CPU: plain C++, no fused multiply-add
  kAvx2,     // AVX2 + FMA + F16C
  kAvx512,   // the same operations with AVX-512VL's 32 registers: kAvx2's bits, faster
};
std::string_view ToString(KernelIsa isa);  // "generic", "avx2", "avx512"
// Whether this CPU can run `isa`.
bool CpuSupports(KernelIsa isa);
// The fastest build this CPU supports.
KernelIsa BestKernelIsa();
// Every build this CPU supports, kGeneric first.
std::vector<KernelIsa> SupportedKernelIsas();

// A row-major weight matrix as stored: element (r, c) at data + r * ld + c
// (in elements of `dtype`: F32, BF16 or F16).
struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t ld = 0;

  // The matrix starting at element (row, column) of this one.
  WeightMatrix At(int64_t row, int64_t column) const {
    WeightMatrix out = *this;
    out.data = static_cast<const char*>(data) + (row * ld + column) * DTypeSize(dtype);
    return out;
  }
};
// The tensor from its flat element `offset` on, with leading dimension `ld`.
WeightMatrix MatrixOf(const Tensor& tensor, int64_t ld, int64_t offset = 0);

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
};

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
};
// `isa` must be supported by this CPU (CpuSupports).
const MatmulKernels& KernelsFor(KernelIsa isa);

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
