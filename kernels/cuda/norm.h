// Row normalisation (RMSNorm, LayerNorm) on the GPU, the math of the CPU
// backend's NormRows: statistics in f32 over the row (two passes: mean, then
// the centred variance), out = (x - mean) * rsqrt(var + eps) * weight + bias.
#ifndef SWITCHSERVE_KERNELS_CUDA_NORM_H_
#define SWITCHSERVE_KERNELS_CUDA_NORM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace switchserve::cuda {

enum class NormType : int { kRms, kLayer };  // kRms: mean taken as 0, no bias

// For `rows` rows of width d (row stride d) in device memory: out and/or
// out_bf16 (either may be null) = Norm(x). `bias` may be null.
cudaError_t LaunchNormRows(NormType type, float eps, const float* x, int rows, int d,
                           const float* weight, const float* bias, float* out,
                           __nv_bfloat16* out_bf16, cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_NORM_H_
