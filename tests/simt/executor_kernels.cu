#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/simt.h"
#include "tests/simt/executor_kernels.h"

namespace switchserve::simt_test {
namespace {

using simt::kFullMask;
using simt::kWarp;

__device__ __forceinline__ int LinearThread() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

__global__ void BarrierRoundsKernel(int rounds, int dynamic, int* out) {
  SIMT_SHARED(int, fixed, 1024);
  SIMT_DYNAMIC_SHARED(int, flexible);
  int* values = dynamic != 0 ? flexible : fixed;
  const int n = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int i = LinearThread();
  int sum = 0;
  for (int r = 0; r < rounds; ++r) {
    values[i] = i * 31 + r;
    __syncthreads();
    sum += values[(7 * i + 13 * r + 1) % n];
    __syncthreads();
  }
  out[i] = sum;
}

__global__ void LaneIdsKernel(int* first, int* neighbour) {
  const int i = LinearThread();
  first[i] = __shfl_sync(kFullMask, i, 0);
  neighbour[i] = __shfl_xor_sync(kFullMask, i, 1);
}

__global__ void ShufflesKernel(int width, int* out) {
  const int i = static_cast<int>(threadIdx.x);
  const int lane = i % kWarp;
  const int v = 10 * i + 3;
  const unsigned delta = width > 2 ? 3 : 1;
  const int mask = lane % 3 == 0 ? width / 2 : width;
  out[4 * i + 0] = __shfl_sync(kFullMask, v, (5 * lane + 3) % 40, width);
  out[4 * i + 1] = __shfl_up_sync(kFullMask, v, delta, width);
  out[4 * i + 2] = __shfl_down_sync(kFullMask, v, delta, width);
  out[4 * i + 3] = __shfl_xor_sync(kFullMask, v, mask, width);
}

__global__ void VotesKernel(unsigned* ballot, unsigned* match_int, unsigned* match_float, int* vote,
                            int* block) {
  const int i = static_cast<int>(threadIdx.x);
  const int n = static_cast<int>(blockDim.x);
  const int lane = i % kWarp;
  ballot[i] = __ballot_sync(kFullMask, lane % 3 == 0);
  match_int[i] = __match_any_sync(kFullMask, lane % 5);
  match_float[i] = __match_any_sync(kFullMask, 0.5f * static_cast<float>(i % 4));
  vote[2 * i] = __all_sync(kFullMask, lane < 20);
  vote[2 * i + 1] = __any_sync(kFullMask, lane == 7);
  block[3 * i + 0] = __syncthreads_count(i % 3 == 0);
  block[3 * i + 1] = __syncthreads_and(i >= 0);
  block[3 * i + 2] = __syncthreads_or(i == n - 1);
}

__global__ void BlockSumKernel(const float* x, float* out) {
  SIMT_SHARED(float, scratch, kWarp);
  const float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  const float total = switchserve::cuda::BlockReduce(v, switchserve::cuda::SumOp{}, 0.0f, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// Thread 0 of each of `expected` blocks arrives; true once all have arrived,
// false when they did not within a bounded wait (blocks not concurrent).
__device__ bool Rendezvous(int* counter, int expected) {
  atomicAdd(counter, 1);
  for (long long spins = 0; spins < (1ll << 31); ++spins) {
    if (atomicAdd(counter, 0) >= expected) return true;
  }
  return false;
}

constexpr int kIsolationThreads = 128;

__global__ void SharedIsolationKernel(int* counters, int* met, int* wrong) {
  SIMT_SHARED(int, fixed, kIsolationThreads);
  SIMT_SHARED(int, both_met, 1);
  SIMT_DYNAMIC_SHARED(int, flexible);
  const int i = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  if (i == 0) both_met[0] = Rendezvous(&counters[0], 2) ? 1 : 0;
  fixed[i] = 1000 * (b + 1) + i;
  flexible[i] = 2000 * (b + 1) + i;
  __syncthreads();
  if (i == 0 && !Rendezvous(&counters[1], 2)) both_met[0] = 0;
  __syncthreads();
  const int j = (i + 1) % kIsolationThreads;
  int bad = 0;
  if (fixed[j] != 1000 * (b + 1) + j) ++bad;
  if (flexible[j] != 2000 * (b + 1) + j) ++bad;
  atomicAdd(&wrong[b], bad);
  if (i == 0) met[b] = both_met[0];
}

__device__ void AtomicMaxFloat(float* address, float value) {
  int* bits = reinterpret_cast<int*>(address);
  int old = atomicAdd(bits, 0);
  while (__int_as_float(old) < value) {
    const int assumed = old;
    old = atomicCAS(bits, assumed, __float_as_int(value));
    if (old == assumed) break;
  }
}

__global__ void AtomicsKernel(int* int_sum, float* float_sum, int* int_max, float* float_max,
                              int* block_count) {
  SIMT_SHARED(int, count, 1);
  if (threadIdx.x == 0) count[0] = 0;
  __syncthreads();
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(int_sum, 1);
  atomicAdd(float_sum, 1.0f);
  atomicMax(int_max, g);
  AtomicMaxFloat(float_max, 0.5f * static_cast<float>(g));
  atomicAdd(&count[0], 1);
  __syncthreads();
  if (threadIdx.x == 0) block_count[blockIdx.x] = count[0];
}

__global__ void LargeLocalArrayKernel(int* out) {
  constexpr int kLocal = 4096;  // 16 KiB of int
  int local[kLocal];
  const int i = static_cast<int>(threadIdx.x);
  for (int j = 0; j < kLocal; ++j) local[j] = j + i;
  int sum = 0;
  for (int j = 0; j < kLocal; ++j) sum += local[(j * 7 + i) % kLocal];
  out[i] = sum;
}

}  // namespace

cudaError_t LaunchLargeLocalArray(int* out) {
  return SIMT_LAUNCH(LargeLocalArrayKernel, dim3(1), dim3(64), 0, nullptr, out);
}

cudaError_t LaunchBarrierRounds(dim3 block, int rounds, bool dynamic, int* out) {
  const size_t shared_bytes =
      dynamic ? sizeof(int) * static_cast<size_t>(block.x) * block.y * block.z : 0;
  return SIMT_LAUNCH(BarrierRoundsKernel, dim3(1), block, shared_bytes, nullptr, rounds,
                     dynamic ? 1 : 0, out);
}

cudaError_t LaunchLaneIds(dim3 block, int* first, int* neighbour) {
  return SIMT_LAUNCH(LaneIdsKernel, dim3(1), block, 0, nullptr, first, neighbour);
}

cudaError_t LaunchShuffles(int n, int width, int* out) {
  return SIMT_LAUNCH(ShufflesKernel, dim3(1), dim3(n), 0, nullptr, width, out);
}

cudaError_t LaunchVotes(int n, unsigned* ballot, unsigned* match_int, unsigned* match_float,
                        int* vote, int* block) {
  return SIMT_LAUNCH(VotesKernel, dim3(1), dim3(n), 0, nullptr, ballot, match_int, match_float,
                     vote, block);
}

cudaError_t LaunchBlockSum(int blocks, int threads, const float* x, float* out) {
  return SIMT_LAUNCH(BlockSumKernel, dim3(blocks), dim3(threads), 0, nullptr, x, out);
}

cudaError_t LaunchSharedIsolation(int* counters, int* met, int* wrong) {
  return SIMT_LAUNCH(SharedIsolationKernel, dim3(2), dim3(kIsolationThreads),
                     sizeof(int) * kIsolationThreads, nullptr, counters, met, wrong);
}

cudaError_t LaunchAtomics(int blocks, int* int_sum, float* float_sum, int* int_max,
                          float* float_max, int* block_count) {
  return SIMT_LAUNCH(AtomicsKernel, dim3(blocks), dim3(128), 0, nullptr, int_sum, float_sum,
                     int_max, float_max, block_count);
}

}  // namespace switchserve::simt_test
