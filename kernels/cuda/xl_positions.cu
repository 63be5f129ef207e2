// XL position keys: one thread per table entry, a double fma chain over d.
#include <cstdint>

#include "kernels/cuda/simt.h"
#include "kernels/cuda/xl_positions.h"

namespace switchserve::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    XlPositionKeysKernel(const float* pos_to_pk, const double* pe, int head_dim, int d,
                         int positions, int64_t entries, float* keys) {
  SIMT_GRID_WAIT();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= entries) return;  // no barrier in this kernel
  const int c = static_cast<int>(i % head_dim);
  const int64_t delta = (i / head_dim) % positions;
  const int64_t h = i / (static_cast<int64_t>(head_dim) * positions);
  const float* p = pos_to_pk + (h * head_dim + c) * d;
  const double* e = pe + delta * d;
  double sum = 0.0;
  for (int m = 0; m < d; ++m) sum = fma(static_cast<double>(p[m]), e[m], sum);
  keys[i] = static_cast<float>(sum);
}

}  // namespace

cudaError_t LaunchXlPositionKeys(const float* pos_to_pk, const double* pe, int heads, int head_dim,
                                 int d, int positions, float* keys, cudaStream_t stream) {
  const int64_t entries = static_cast<int64_t>(heads) * positions * head_dim;
  if (entries == 0) return cudaSuccess;
  const int64_t blocks = (entries + kThreads - 1) / kThreads;
  return SIMT_LAUNCH_DEPENDENT(XlPositionKeysKernel, dim3(static_cast<unsigned>(blocks)),
                               dim3(kThreads), 0, stream, pos_to_pk, pe, head_dim, d, positions,
                               entries, keys);
}

}  // namespace switchserve::cuda
