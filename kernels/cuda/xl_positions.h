// Transformer-XL relative positions (attention.position "xl") on the device:
// each layer's table of position keys, the CPU backend's R
// (kernels/cpu/cpu_xl_positions.h), tabulated once when the backend is
// created:
//   R_h[delta][c] = sum_m pos_to_pk[h * dh + c][m] * pe[delta][m]
// with pe[delta] = dh^-1/4 * (sin, cos)(-delta * w_m) interleaved, computed on
// the host in double (as the CPU backend does), the sum in double, rounded
// once to f32. Layout [H, positions, dh]: R_h[delta] is the dh floats at
// (h * positions + delta) * dh. Attention adds q_h . R_h[i - j] to the score
// of query position i and key position j (attention.h).
#ifndef SWITCHSERVE_KERNELS_CUDA_XL_POSITIONS_H_
#define SWITCHSERVE_KERNELS_CUDA_XL_POSITIONS_H_

#include <cuda_runtime_api.h>

namespace switchserve::cuda {

// pos_to_pk: [H * dh, d] f32; pe: [positions, d] double; keys: [H, positions,
// dh] f32 (device memory).
cudaError_t LaunchXlPositionKeys(const float* pos_to_pk, const double* pe, int heads, int head_dim,
                                 int d, int positions, float* keys, cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_XL_POSITIONS_H_
