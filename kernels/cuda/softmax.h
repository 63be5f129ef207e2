// Row softmax on the GPU: y[r, i] = exp(x[r, i] - max_r) / sum_r over the
// first n columns of each row, in f32 (the CPU attention's math).
#ifndef SWITCHSERVE_KERNELS_CUDA_SOFTMAX_H_
#define SWITCHSERVE_KERNELS_CUDA_SOFTMAX_H_

#include <cuda_runtime_api.h>

namespace switchserve::cuda {

// `rows` rows of n values at x + r * ld (device memory) into y + r * ld; y may
// be x. A row of -inf only becomes NaN, as in the CPU attention.
cudaError_t LaunchSoftmaxRows(const float* x, float* y, int rows, int n, int ld,
                              cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_SOFTMAX_H_
