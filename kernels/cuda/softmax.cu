// Row softmax: one block per row; max and sum by block reductions.
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/softmax.h"

namespace switchserve::cuda {
namespace {

constexpr int kMaxThreads = 256;

__global__ void __launch_bounds__(kMaxThreads)
    SoftmaxRowsKernel(const float* x, float* y, int n, int ld) {
  SIMT_GRID_WAIT();
  SIMT_SHARED(float, scratch, simt::kWarp);
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * ld;
  const float* xr = x + offset;
  float* yr = y + offset;
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) local_max = fmaxf(local_max, xr[i]);
  const float row_max = BlockReduce(local_max, MaxOp{}, -INFINITY, scratch);
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) local_sum += expf(xr[i] - row_max);
  const float inv_sum = 1.0f / BlockReduce(local_sum, SumOp{}, 0.0f, scratch);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = expf(xr[i] - row_max) * inv_sum;
}

}  // namespace

cudaError_t LaunchSoftmaxRows(const float* x, float* y, int rows, int n, int ld,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  int threads = simt::kWarp;
  while (threads < kMaxThreads && threads < n) threads *= 2;
  return SIMT_LAUNCH_DEPENDENT(SoftmaxRowsKernel, dim3(rows), dim3(threads), 0, stream, x, y, n,
                               ld);
}

}  // namespace switchserve::cuda
