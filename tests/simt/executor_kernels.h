// Test kernels for the CUDA semantics the SIMT executor must reproduce
// (barriers, warp intrinsics, shared memory, atomics). They build with nvcc
// too, so the same expectations hold on a GPU. Pointers are device memory.
#ifndef SWITCHSERVE_TESTS_SIMT_EXECUTOR_KERNELS_H_
#define SWITCHSERVE_TESTS_SIMT_EXECUTOR_KERNELS_H_

#include <cuda_runtime_api.h>

namespace switchserve::simt_test {

// One block of `block` threads; `rounds` rounds of: every thread writes a
// value into shared memory, barrier, reads another thread's value, barrier.
// out[linear thread id] = the sum of the values it read (value of thread j in
// round r: j * 31 + r; thread i reads j = (7 i + 13 r + 1) mod n).
// `dynamic` uses dynamic shared memory, else SIMT_SHARED (up to 1024).
cudaError_t LaunchBarrierRounds(dim3 block, int rounds, bool dynamic, int* out);

// One block; thread with linear id i (x fastest) writes
// first[i] = __shfl_sync(all, i, 0) and neighbour[i] = __shfl_xor_sync(all, i, 1).
cudaError_t LaunchLaneIds(dim3 block, int* first, int* neighbour);

// One block of n threads (a multiple of 32). Thread i has value v = 10 i + 3,
// lane l = i % 32, and writes out[4 i + ...]:
//   0: __shfl_sync(v, src = (5 l + 3) % 40, width)
//   1: __shfl_up_sync(v, delta, width)     delta = width > 2 ? 3 : 1
//   2: __shfl_down_sync(v, delta, width)
//   3: __shfl_xor_sync(v, mask, width)     mask = l % 3 == 0 ? width / 2 : width
cudaError_t LaunchShuffles(int n, int width, int* out);

// One block of n threads (any n <= 1024; the last warp may be short). Thread i
// (lane l) writes ballot[i] = __ballot_sync(all, l % 3 == 0),
// match_int[i] = __match_any_sync(all, l % 5), match_float[i] =
// __match_any_sync(all, 0.5f * (i % 4)), vote[2 i] = __all_sync(all, l < 20),
// vote[2 i + 1] = __any_sync(all, l == 7), and block[3 i ...] =
// __syncthreads_count / _and / _or of (i % 3 == 0), (i >= 0), (i == n - 1).
cudaError_t LaunchVotes(int n, unsigned* ballot, unsigned* match_int, unsigned* match_float,
                        int* vote, int* block);

// blocks x threads: out[b] = sum of x[b * threads + i] by BlockReduce
// (warp butterflies, then warp 0 reduces the warp totals: `if (warp == 0)`).
cudaError_t LaunchBlockSum(int blocks, int threads, const float* x, float* out);

// Two blocks of 128 threads that first wait for each other (proving they run
// at the same time), then fill their shared arrays (SIMT_SHARED and dynamic)
// with block-specific values, wait for each other again and check them:
// met[b] = 1 if both rendezvous happened, wrong[b] = values not their own.
// `counters` is two zeroed ints.
cudaError_t LaunchSharedIsolation(int* counters, int* met, int* wrong);

// blocks x 128 threads, each thread with global id g: atomicAdd(int_sum, 1),
// atomicAdd(float_sum, 1.0f), atomicMax(int_max, g), a float max of 0.5 g by
// atomicCAS, and a per-block count by atomicAdd on shared memory written to
// block_count[b]. The scalars start at 0.
cudaError_t LaunchAtomics(int blocks, int* int_sum, float* float_sum, int* int_max,
                          float* float_max, int* block_count);

// One block of 64 threads, each with a 16 KiB local array (as a GPU allows,
// spilled to local memory; the executor's fiber stacks must hold it):
// out[i] = sum over j < 4096 of local[(j * 7 + i) % 4096], local[j] = j + i.
cudaError_t LaunchLargeLocalArray(int* out);

}  // namespace switchserve::simt_test

#endif  // SWITCHSERVE_TESTS_SIMT_EXECUTOR_KERNELS_H_
