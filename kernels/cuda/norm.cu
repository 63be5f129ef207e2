// RMSNorm / LayerNorm: one block per row.
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
  SIMT_SHARED(float, scratch, simt::kWarp);
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float mean = 0.0f;
  if (type == NormType::kLayer) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) sum += xr[i];
    mean = BlockReduce(sum, SumOp{}, 0.0f, scratch) / static_cast<float>(d);
  }
  float squares = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = xr[i] - mean;
    squares += c * c;
  }
  const float var = BlockReduce(squares, SumOp{}, 0.0f, scratch) / static_cast<float>(d);
  const float inv = rsqrtf(var + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float o = (xr[i] - mean) * inv * weight[i];
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
