// Matrix products of the CUDA backend with activations on the left and model
// weights on the right, in f32 arithmetic, and with a reduction order that
// does not depend on the batch: k is cut into chunks of 32, each chunk is an
// fmaf chain from zero over its k in increasing order, and the chunk sums are
// added to a total from zero in increasing k, whatever the number of rows,
// the row's place in the batch or the kernel the launcher picks. So a token's
// result is bitwise the same in a decode step, in any prefill chunk and beside
// any neighbours (docs/design.md, "Isolation"), and a decode step can spread
// one matrix over k as well as over its columns.
//
//   dense     out[m, n] = epilogue(alpha * sum_k a[m, k] * W[n, k])   m < rows
//   grouped   the same per expert matrix, over the rows a capacity dispatch
//             gave that expert (dispatch_plan.h): for head h and expert e,
//             matrix h * E + e, router r = shared_router ? 0 : h, slots
//             s in [offsets[r][e], offsets[r][e + 1]):
//               out[h * slot_stride + s, n] = epilogue(alpha * sum_k
//                   a[row(h, s), h * a_head_cols + k] * W_{h*E+e}[n, k])
//             row(h, s) = a_rows[r * slot_stride + s] (gather by token) or,
//             without a_rows, h * slot_stride + s (rows already in slot order).
//   epilogue  + bias[n] (bias of the matrix), then the activation; stored,
//             or added to what out holds (accumulate).
//
// Weights are f32, bf16 or f16 (widened to f32 in registers); W[n, k] is
// stored either as nn.Linear stores it (kNK: W[n * ld + k]) or transposed
// (kKN: W[k * ld + n], SwitchHead's v [d, dh] and o [dh, d] experts).
#ifndef SWITCHSERVE_KERNELS_CUDA_LINEAR_H_
#define SWITCHSERVE_KERNELS_CUDA_LINEAR_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace switchserve::cuda {

enum class WeightType : int { kF32, kBf16, kF16 };
enum class WeightLayout : int { kNK, kKN };
// The CPU backend's activations, same formulas (exact-erf GELU).
enum class Activation : int { kNone, kRelu, kGelu, kSilu };

struct LinearWeights {
  const void* data = nullptr;
  WeightType type = WeightType::kF32;
  WeightLayout layout = WeightLayout::kNK;
  int64_t ld = 0;             // elements between rows of the stored matrix
  int64_t matrix_stride = 0;  // elements between expert matrices (grouped)
};

struct LinearEpilogue {
  float alpha = 1.0f;
  const float* bias = nullptr;  // [N] per matrix, or null
  int64_t bias_stride = 0;      // elements between expert biases (grouped)
  Activation activation = Activation::kNone;
  bool accumulate = false;  // out += result instead of out = result
};

// The kernel that runs a product: by default the launcher picks by shape;
// a test names one (all of them give the same bits).
enum class LinearKernelChoice : int { kAuto, kFewRows, kTiles };

// out[m, n] for m < rows, n < n_cols; a rows lda apart, out rows ldc apart.
cudaError_t LaunchLinear(const float* a, int64_t lda, int rows, int k, const LinearWeights& w,
                         int n_cols, const LinearEpilogue& epilogue, float* out, int64_t ldc,
                         cudaStream_t stream,
                         LinearKernelChoice kernel = LinearKernelChoice::kAuto);

struct GroupedRows {
  const int32_t* offsets = nullptr;  // [routers, E + 1] slot ranges (dispatch_plan.h)
  const int32_t* a_rows = nullptr;   // [routers, slot_stride] row of a per slot, or null
  int64_t slot_stride = 0;           // slots per router (and rows per head plane of out)
  int max_rows = 0;                  // upper bound on any expert's slots (grid size)
  int n_experts = 1;
  int heads = 1;  // planes of out; matrices = heads * n_experts
  bool shared_router = false;
  int64_t a_head_cols = 0;  // column offset of head h in a: h * a_head_cols
};

cudaError_t LaunchGroupedLinear(const float* a, int64_t lda, const GroupedRows& rows, int k,
                                const LinearWeights& w, int n_cols, const LinearEpilogue& epilogue,
                                float* out, int64_t ldc, cudaStream_t stream,
                                LinearKernelChoice kernel = LinearKernelChoice::kAuto);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_LINEAR_H_
