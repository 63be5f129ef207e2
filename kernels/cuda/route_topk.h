// Router top-k on the GPU, the CPU's RouteTokens (engine/moe/expert_dispatch.h)
// on device memory: the probabilities in double as the CPU computes them,
// experts ranked by logit with strict > over ascending e (ties to the lower
// expert), then the gate weight of each choice.
#ifndef SWITCHSERVE_KERNELS_CUDA_ROUTE_TOPK_H_
#define SWITCHSERVE_KERNELS_CUDA_ROUTE_TOPK_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace switchserve::cuda {

// The CPU's GateFunction, same order.
enum class GateType : int { kSoftmax, kSigmoid, kSoftmaxTopK };

// logits: [tokens, n_experts], row stride ld. Outputs (device memory):
// expert and weight [tokens, top_k] in rank order; prob [tokens, n_experts],
// P(e | token) for the statistics. One warp per token. With several
// `routers` (the heads of an attention layer), router r reads the logits from
// column r * router_offset on and writes expert, weight + r * tokens * top_k
// and prob + r * tokens * n_experts.
// Dynamic shared memory of the launch's blocks: each of its 4 warps holds a
// token's E gate terms (double), E logits and k choices, 4 * (12 E + 4 k)
// bytes. Past 48 KiB the launch opts in to more; past the device's opt-in
// limit (cudaDevAttrMaxSharedMemoryPerBlockOptin) it fails.
size_t RouteTopKSharedBytes(int n_experts, int top_k);

cudaError_t LaunchRouteTopK(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                            GateType gate, bool renormalize, int32_t* expert, float* weight,
                            float* prob, cudaStream_t stream, int routers = 1,
                            int64_t router_offset = 0);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_ROUTE_TOPK_H_
