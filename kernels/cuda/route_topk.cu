// Router top-k: one thread per token, looping over its experts. The
// arithmetic repeats RouteTokens operation for operation (double sums, float
// sigmoid), so that on the executor the results are bit-identical to the CPU
// and on a GPU they differ only by its exp/expf rounding.
#include "kernels/cuda/route_topk.h"
#include "kernels/cuda/simt.h"

namespace switchserve::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float Sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

__global__ void __launch_bounds__(kThreads)
    RouteTopKKernel(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                    GateType gate, int renormalize, int32_t* expert, float* weight, float* prob,
                    int64_t router_offset) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;  // no barrier in this kernel
  const int64_t router = blockIdx.y;
  logits += router * router_offset;
  expert += router * tokens * top_k;
  weight += router * tokens * top_k;
  prob += router * tokens * n_experts;
  const float* z = logits + t * ld;
  // The experts chosen so far, in this thread's slice of shared memory (the
  // selection loop reads them k x E times).
  SIMT_DYNAMIC_SHARED(int32_t, picked);
  int32_t* chosen = picked + static_cast<int64_t>(threadIdx.x) * top_k;
  float* w = weight + static_cast<int64_t>(t) * top_k;
  float* p = prob + static_cast<int64_t>(t) * n_experts;

  float zmax = z[0];
  for (int e = 1; e < n_experts; ++e) zmax = zmax < z[e] ? z[e] : zmax;
  if (gate == GateType::kSigmoid) {
    double sum = 0;
    for (int e = 0; e < n_experts; ++e) sum += Sigmoid(z[e]);
    for (int e = 0; e < n_experts; ++e) p[e] = static_cast<float>(Sigmoid(z[e]) / sum);
  } else {
    double denom = 0;
    for (int e = 0; e < n_experts; ++e) denom += exp(static_cast<double>(z[e] - zmax));
    for (int e = 0; e < n_experts; ++e) {
      p[e] = static_cast<float>(exp(static_cast<double>(z[e] - zmax)) / denom);
    }
  }

  for (int r = 0; r < top_k; ++r) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int q = 0; q < r; ++q) taken = taken || chosen[q] == e;
      if (taken) continue;
      if (best < 0 || z[e] > z[best]) best = e;
    }
    chosen[r] = best;
  }

  int32_t* out_expert = expert + static_cast<int64_t>(t) * top_k;
  for (int r = 0; r < top_k; ++r) out_expert[r] = chosen[r];

  if (gate == GateType::kSoftmaxTopK) {
    const float zk = z[chosen[0]];
    double sum = 0;
    for (int r = 0; r < top_k; ++r) sum += exp(static_cast<double>(z[chosen[r]] - zk));
    for (int r = 0; r < top_k; ++r) {
      w[r] = static_cast<float>(exp(static_cast<double>(z[chosen[r]] - zk)) / sum);
    }
    return;
  }
  double sum = 0;
  for (int r = 0; r < top_k; ++r) {
    w[r] = gate == GateType::kSigmoid ? Sigmoid(z[chosen[r]]) : p[chosen[r]];
    sum += w[r];
  }
  if (renormalize != 0 && sum > 0) {
    for (int r = 0; r < top_k; ++r) w[r] = static_cast<float>(w[r] / sum);
  }
}

}  // namespace

cudaError_t LaunchRouteTopK(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                            GateType gate, bool renormalize, int32_t* expert, float* weight,
                            float* prob, cudaStream_t stream, int routers, int64_t router_offset) {
  if (tokens == 0) return cudaSuccess;
  if (routers < 1) return cudaErrorInvalidValue;
  const int blocks = (tokens + kThreads - 1) / kThreads;
  const size_t shared_bytes = static_cast<size_t>(kThreads) * top_k * sizeof(int32_t);
  constexpr size_t kDefaultShared = 48 * 1024;
  if (shared_bytes > kDefaultShared) {
    const cudaError_t e =
        cudaFuncSetAttribute(RouteTopKKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(shared_bytes));
    if (e != cudaSuccess) return e;
  }
  return SIMT_LAUNCH(RouteTopKKernel, dim3(blocks, routers), dim3(kThreads), shared_bytes, stream,
                     logits, ld, tokens, n_experts, top_k, gate, renormalize ? 1 : 0, expert,
                     weight, prob, router_offset);
}

}  // namespace switchserve::cuda
