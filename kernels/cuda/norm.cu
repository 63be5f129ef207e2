// RMSNorm / LayerNorm: one block per row.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/simt.h"

namespace switchserve::cuda {
namespace {

constexpr int kMaxThreads = 256;

__global__ void __launch_bounds__(kMaxThreads)
    NormRowsKernel(NormType type, float eps, const float* x, int d, const float* weight,
                   const float* bias, float* out, __nv_bfloat16* out_bf16) {
  SIMT_GRID_WAIT();
  SIMT_SHARED(double, scratch, simt::kWarp);
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  // The mean and variance in double, as the CPU backend computes them: the
  // squares of a row of |x| ~ 1e20 overflow f32, and a norm is meant to
  // normalise any scale. Each sum in a fixed order for a given d.
  double mean = 0.0;
  if (type == NormType::kLayer) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i];
    mean = BlockReduce(sum, SumOp{}, 0.0, scratch) / d;
  }
  double squares = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const double c = xr[i] - mean;
    squares += c * c;
  }
  const double var = BlockReduce(squares, SumOp{}, 0.0, scratch) / d;
  const float inv = static_cast<float>(1.0 / sqrt(var + eps));
  const float m = static_cast<float>(mean);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float o = (xr[i] - m) * inv * weight[i];
    if (bias != nullptr) o += bias[i];
    if (out != nullptr) out[row * d + i] = o;
    if (out_bf16 != nullptr) out_bf16[row * d + i] = __float2bfloat16_rn(o);
  }
}

}  // namespace

cudaError_t LaunchNormRows(NormType type, float eps, const float* x, int rows, int d,
                           const float* weight, const float* bias, float* out,
                           __nv_bfloat16* out_bf16, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  // A multiple of 32 (BlockReduce), no more threads than a row has columns.
  int threads = simt::kWarp;
  while (threads < kMaxThreads && threads < d) threads *= 2;
  return SIMT_LAUNCH_DEPENDENT(NormRowsKernel, dim3(rows), dim3(threads), 0, stream, type, eps, x,
                               d, weight, bias, out, out_bf16);
}

}  // namespace switchserve::cuda
