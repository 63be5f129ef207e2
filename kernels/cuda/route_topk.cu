// Router top-k: one warp per token. The arithmetic repeats RouteTokens
// operation for operation (double sums, float sigmoid), so that on the
// executor the results are bit-identical to the CPU and on a GPU they differ
// only by its exp/expf rounding. The lanes share what is elementwise (the
// token's logits into shared memory, each expert's gate term and
// probability) and the top-k (a warp argmax per rank); lane 0 alone takes
// what has an order (the maximum, the double sums in expert order, the
// weights), on the shared copy.
#include <cmath>

#include "kernels/cuda/route_topk.h"
#include "kernels/cuda/simt.h"

namespace switchserve::cuda {
namespace {

using simt::kFullMask;
using simt::kWarp;

constexpr int kThreads = 128;
constexpr int kTokensPerBlock = kThreads / kWarp;

__device__ __forceinline__ float Sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// Dynamic shared memory per warp: the token's gate terms [E] (double), its
// logits [E] and the chosen experts [k].
size_t SharedBytesPerWarp(int n_experts, int top_k) {
  return static_cast<size_t>(n_experts) * (sizeof(double) + sizeof(float)) +
         static_cast<size_t>(top_k) * sizeof(int32_t);
}

__global__ void __launch_bounds__(kThreads)
    RouteTopKKernel(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                    GateType gate, int renormalize, int32_t* expert, float* weight, float* prob,
                    int64_t router_offset) {
  SIMT_GRID_WAIT();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + warp;
  if (t >= tokens) return;  // whole warps; only warp-level synchronisation below
  const int E = n_experts;
  const int64_t router = blockIdx.y;
  const float* z = logits + router * router_offset + t * ld;
  float* w = weight + (router * tokens + t) * top_k;
  float* p = prob + (router * tokens + t) * E;
  int32_t* out_expert = expert + (router * tokens + t) * top_k;
  SIMT_DYNAMIC_SHARED(double, shared);
  double* terms = shared;                                                           // [warps, E]
  float* logit_copies = reinterpret_cast<float*>(terms + kTokensPerBlock * E);      // [warps, E]
  int32_t* picks = reinterpret_cast<int32_t*>(logit_copies + kTokensPerBlock * E);  // [warps, k]
  double* term = terms + static_cast<int64_t>(warp) * E;
  float* zs = logit_copies + static_cast<int64_t>(warp) * E;
  int32_t* chosen = picks + static_cast<int64_t>(warp) * top_k;

  for (int e = lane; e < E; e += kWarp) zs[e] = z[e];
  __syncwarp();
  float zmax = 0.0f;
  if (lane == 0 && gate != GateType::kSigmoid) {
    zmax = zs[0];
    for (int e = 1; e < E; ++e) zmax = zmax < zs[e] ? zs[e] : zmax;
  }
  zmax = __shfl_sync(kFullMask, zmax, 0);
  for (int e = lane; e < E; e += kWarp) {
    term[e] = gate == GateType::kSigmoid ? static_cast<double>(Sigmoid(zs[e]))
                                         : exp(static_cast<double>(zs[e] - zmax));
  }
  __syncwarp();
  // The top-k: experts by logit, strict > over ascending e (ties to the
  // lower expert). Each lane scans its experts e = lane + 32 i and the warp
  // takes the best of the lanes' bests, which is the ascending scan's answer
  // whenever the logits are ordered; a NaN among them (or more experts than
  // the lanes' masks hold) leaves it to lane 0's scan.
  bool ordered = E <= kWarp * kWarp;
  for (int e = lane; e < E; e += kWarp) ordered = ordered && !std::isnan(zs[e]);
  ordered = __all_sync(kFullMask, ordered);
  if (ordered) {
    unsigned taken = 0;  // bit i: expert lane + 32 i chosen
    for (int r = 0; r < top_k; ++r) {
      int best = -1;
      for (int i = 0, e = lane; e < E; ++i, e += kWarp) {
        if ((taken >> i & 1u) == 0 && (best < 0 || zs[e] > zs[best])) best = e;
      }
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        const int other = __shfl_xor_sync(kFullMask, best, offset);
        if (other >= 0 &&
            (best < 0 || zs[other] > zs[best] || (zs[other] == zs[best] && other < best))) {
          best = other;
        }
      }
      if (best % kWarp == lane) taken |= 1u << (best / kWarp);
      if (lane == 0) chosen[r] = best;
    }
  }
  if (!ordered && lane == 0) {
    for (int r = 0; r < top_k; ++r) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int q = 0; q < r; ++q) taken = taken || chosen[q] == e;
        if (taken) continue;
        if (best < 0 || zs[e] > zs[best]) best = e;
      }
      chosen[r] = best;
    }
  }
  double sum = 0;
  if (lane == 0) {
    for (int e = 0; e < E; ++e) sum += term[e];
  }
  sum = __shfl_sync(kFullMask, sum, 0);
  __syncwarp();
  for (int e = lane; e < E; e += kWarp) p[e] = static_cast<float>(term[e] / sum);
  for (int r = lane; r < top_k; r += kWarp) out_expert[r] = chosen[r];
  if (lane != 0) return;

  if (gate == GateType::kSoftmaxTopK) {
    const float zk = zs[chosen[0]];
    double topk_sum = 0;
    for (int r = 0; r < top_k; ++r) topk_sum += exp(static_cast<double>(zs[chosen[r]] - zk));
    for (int r = 0; r < top_k; ++r) {
      w[r] = static_cast<float>(exp(static_cast<double>(zs[chosen[r]] - zk)) / topk_sum);
    }
    return;
  }
  double weight_sum = 0;
  for (int r = 0; r < top_k; ++r) {
    // The probability as written to p above.
    w[r] = gate == GateType::kSigmoid ? Sigmoid(zs[chosen[r]])
                                      : static_cast<float>(term[chosen[r]] / sum);
    weight_sum += w[r];
  }
  if (renormalize != 0 && weight_sum > 0) {
    for (int r = 0; r < top_k; ++r) w[r] = static_cast<float>(w[r] / weight_sum);
  }
}

}  // namespace

size_t RouteTopKSharedBytes(int n_experts, int top_k) {
  return kTokensPerBlock * SharedBytesPerWarp(n_experts, top_k);
}

cudaError_t LaunchRouteTopK(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                            GateType gate, bool renormalize, int32_t* expert, float* weight,
                            float* prob, cudaStream_t stream, int routers, int64_t router_offset) {
  if (tokens == 0) return cudaSuccess;
  if (routers < 1) return cudaErrorInvalidValue;
  const int blocks = (tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  const size_t shared_bytes = RouteTopKSharedBytes(n_experts, top_k);
  if (const cudaError_t e = simt::AllowDynamicShared(RouteTopKKernel, shared_bytes);
      e != cudaSuccess) {
    return e;
  }
  return SIMT_LAUNCH_DEPENDENT(RouteTopKKernel, dim3(blocks, routers), dim3(kThreads), shared_bytes,
                               stream, logits, ld, tokens, n_experts, top_k, gate,
                               renormalize ? 1 : 0, expert, weight, prob, router_offset);
}

}  // namespace switchserve::cuda
