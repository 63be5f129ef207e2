// Misuse the executor reports (emulated build only): a host pointer as kernel
// argument, copies whose direction contradicts their pointers, use after
// free, barriers and warp intrinsics not reached by every thread, bad warp
// masks, launch limits; and the runtime behaviours that expose bugs: queued
// work runs only at synchronisation, fresh memory is poisoned.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/dependent_launch.h"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/simt_control.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using ::testing::HasSubstr;

__global__ void WriteIndex(int* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = i;
}

__global__ void EarlyExitBeforeBarrier(int* out) {
  if (threadIdx.x < 10) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// The first warp waits at one barrier, the second at another: each would
// release the other here, and on a GPU it is undefined.
__global__ void DivergentBarriers(int* out) {
  if (threadIdx.x < 32) {
    out[threadIdx.x] = 1;
    __syncthreads();
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

__global__ void HalfWarpShuffle(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) v = __shfl_xor_sync(simt::kFullMask, v, 1);
  out[threadIdx.x] = v;
}

__global__ void PartialMaskShuffle(int* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 0);
}

__global__ void DynamicSharedCopy(int* out) {
  SIMT_DYNAMIC_SHARED(int, values);
  values[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = values[blockDim.x - 1 - threadIdx.x];
}

__global__ void ReadSharedBeforeWriting(int* out) {
  SIMT_SHARED(int, values, 64);
  out[blockIdx.x * blockDim.x + threadIdx.x] = values[threadIdx.x];
  __syncthreads();
  values[threadIdx.x] = 12345;
}

// A kernel for SIMT_LAUNCH_DEPENDENT: waits for the prior grid first.
__global__ void WaitThenReverse(int* out) {
  SIMT_GRID_WAIT();
  SIMT_SHARED(int, values, 64);
  values[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = values[blockDim.x - 1 - threadIdx.x];
}

// Its shared memory before the wait.
__global__ void SharedBeforeWait(int* out) {
  SIMT_SHARED(int, values, 64);
  SIMT_GRID_WAIT();
  values[threadIdx.x] = 1;
  out[threadIdx.x] = values[threadIdx.x];
}

// Threads 0-9 leave early, without waiting.
__global__ void ExitBeforeWait(int* out) {
  if (threadIdx.x < 10) return;
  SIMT_GRID_WAIT();
  out[threadIdx.x] = 1;
}

class SimtMisuse : public ::testing::Test {
 protected:
  void SetUp() override { in_use_ = simt::DeviceMemoryInUse().allocations; }
  void TearDown() override {
    EXPECT_EQ(simt::DeviceMemoryInUse().allocations, in_use_) << "device memory leaked";
  }

 private:
  int64_t in_use_ = 0;
};

TEST_F(SimtMisuse, HostPointerArgumentIsReportedWithKernelAndArgument) {
  simt::ScopedErrorCapture capture;
  std::vector<int> host(64, -1);
  EXPECT_EQ(SIMT_LAUNCH(WriteIndex, dim3(1), dim3(64), 0, nullptr, host.data(), 64),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(host, std::vector<int>(64, -1)) << "the rejected launch ran";
  EXPECT_THAT(capture.Text(), HasSubstr("kernel 'WriteIndex': argument 0 (int*)"));
  EXPECT_THAT(capture.Text(), HasSubstr("is host memory (not a device allocation)"));
}

TEST_F(SimtMisuse, CopyWhoseDirectionContradictsItsPointersIsReported) {
  simt::ScopedErrorCapture capture;
  DeviceArray<int> device(16);
  std::vector<int> host(16, 3);
  // Pointers swapped relative to the kind.
  EXPECT_EQ(cudaMemcpy(device.get(), host.data(), 64, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_THAT(capture.Text(), HasSubstr("cudaMemcpyDeviceToHost): dst"));
  EXPECT_THAT(capture.Text(), HasSubstr("but the copy kind says host memory"));
  EXPECT_EQ(cudaMemcpy(host.data(), device.get(), 64, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_THAT(capture.Text(),
              HasSubstr("cudaMemcpyHostToDevice): dst " + std::string("0x")));  // host dst
  EXPECT_EQ(cudaMemcpyAsync(device.get(), host.data(), 64, cudaMemcpyDeviceToDevice, nullptr),
            cudaErrorInvalidValue);
  EXPECT_THAT(capture.Text(), HasSubstr("src 0x"));
  EXPECT_EQ(capture.messages().size(), 3u);
  EXPECT_EQ(host, std::vector<int>(16, 3));
}

TEST_F(SimtMisuse, CopyPastTheEndOfAnAllocationIsReported) {
  simt::ScopedErrorCapture capture;
  DeviceArray<int> device(16);
  std::vector<int> host(32, 0);
  EXPECT_EQ(cudaMemcpy(device.get(), host.data(), 128, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_THAT(capture.Text(), HasSubstr("runs past the end of device allocation"));
  EXPECT_THAT(capture.Text(), HasSubstr("(64 bytes)"));
}

TEST_F(SimtMisuse, UseAfterFreeIsReportedForLaunchesCopiesAndFrees) {
  simt::ScopedErrorCapture capture;
  void* p = nullptr;
  ASSERT_CUDA(cudaMalloc(&p, 256));
  ASSERT_CUDA(cudaFree(p));
  int* freed = static_cast<int*>(p);
  EXPECT_EQ(SIMT_LAUNCH(WriteIndex, dim3(1), dim3(64), 0, nullptr, freed, 64),
            cudaErrorIllegalAddress);
  EXPECT_THAT(capture.messages().at(0), HasSubstr("kernel 'WriteIndex': argument 0 (int*)"));
  EXPECT_THAT(capture.messages().at(0), HasSubstr("freed by cudaFree (use after free)"));
  std::vector<int> host(64);
  EXPECT_EQ(cudaMemcpy(host.data(), freed, 256, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_THAT(capture.messages().at(1), HasSubstr("use after free"));
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidDevicePointer);
  EXPECT_THAT(capture.messages().at(2), HasSubstr("not the start of a live device allocation"));
}

TEST_F(SimtMisuse, BarrierNotReachedByEveryThreadIsADeadlockNamingKernelAndThreads) {
  DeviceArray<int> out(64);
  {
    simt::ScopedErrorCapture capture;
    EXPECT_EQ(SIMT_LAUNCH(EarlyExitBeforeBarrier, dim3(1), dim3(64), 0, nullptr, out.get()),
              cudaSuccess);  // queued; the failure shows at synchronisation
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    ASSERT_EQ(capture.messages().size(), 1u);
    const std::string message = capture.messages()[0];
    EXPECT_THAT(message, HasSubstr("kernel 'EarlyExitBeforeBarrier' block (0,0,0)"));
    EXPECT_THAT(message, HasSubstr("deadlock"));
    EXPECT_THAT(message, HasSubstr("threads 10-63 wait at __syncthreads"));
    EXPECT_THAT(message, HasSubstr("threads 0-9 have exited"));
  }
  // The stuck fibers were unwound: later launches run normally.
  ASSERT_EQ(SIMT_LAUNCH(WriteIndex, dim3(2), dim3(32), 0, nullptr, out.get(), 64), cudaSuccess);
  const std::vector<int> result = out.Download();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(result[i], i);
}

TEST_F(SimtMisuse, BarriersReachedOnTheTwoSidesOfADivergentBranchAreReported) {
  DeviceArray<int> out(64);
  for (const std::string& order : TestOrders()) {
    SCOPED_TRACE(order);
    const ScopedOrder scoped(order);
    simt::ScopedErrorCapture capture;
    ASSERT_EQ(SIMT_LAUNCH(DivergentBarriers, dim3(1), dim3(64), 0, nullptr, out.get()),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    ASSERT_EQ(capture.messages().size(), 1u);
    const std::string message = capture.messages()[0];
    EXPECT_THAT(message, HasSubstr("kernel 'DivergentBarriers' block (0,0,0)"));
    EXPECT_THAT(message, HasSubstr("__syncthreads at misuse_test.cc:"));
    EXPECT_THAT(message, HasSubstr("while other threads wait at __syncthreads at misuse_test.cc:"));
    EXPECT_THAT(message, HasSubstr("every thread of a block waits at the same barrier"));
  }
  // A barrier inside a helper that every thread calls is one barrier.
  ASSERT_EQ(SIMT_LAUNCH(WriteIndex, dim3(2), dim3(32), 0, nullptr, out.get(), 64), cudaSuccess);
  const std::vector<int> result = out.Download();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(result[i], i);
}

TEST_F(SimtMisuse, DependentLaunchMustWaitForThePriorGridFirst) {
  DeviceArray<int> out(64);
  {
    simt::ScopedErrorCapture capture;
    ASSERT_EQ(SIMT_LAUNCH_DEPENDENT(SharedBeforeWait, dim3(1), dim3(64), 0, nullptr, out.get()),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    EXPECT_THAT(capture.Text(), HasSubstr("kernel 'SharedBeforeWait' block (0,0,0)"));
    EXPECT_THAT(capture.Text(),
                HasSubstr("launched with SIMT_LAUNCH_DEPENDENT did not call SIMT_GRID_WAIT() "
                          "before SIMT_SHARED"));
  }
  {
    simt::ScopedErrorCapture capture;
    ASSERT_EQ(SIMT_LAUNCH_DEPENDENT(ExitBeforeWait, dim3(1), dim3(64), 0, nullptr, out.get()),
              cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    EXPECT_THAT(capture.Text(), HasSubstr("kernel 'ExitBeforeWait'"));
    EXPECT_THAT(capture.Text(), HasSubstr("did not call SIMT_GRID_WAIT() before its end"));
  }
  // An ordinary launch of the same kernel is not held to it; a dependent
  // launch that waits first runs.
  ASSERT_EQ(SIMT_LAUNCH(ExitBeforeWait, dim3(1), dim3(64), 0, nullptr, out.get()), cudaSuccess);
  ASSERT_EQ(SIMT_LAUNCH_DEPENDENT(WaitThenReverse, dim3(1), dim3(64), 0, nullptr, out.get()),
            cudaSuccess);
  const std::vector<int> result = out.Download();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(result[i], 63 - i);
}

TEST(SimtDependentLaunch, ScopesNestPerThread) {
  EXPECT_FALSE(simt::DependentLaunchRequested());
  {
    const simt::ScopedDependentLaunch on(true);
    EXPECT_TRUE(simt::DependentLaunchRequested());
    {
      const simt::ScopedDependentLaunch off(false);
      EXPECT_FALSE(simt::DependentLaunchRequested());
    }
    EXPECT_TRUE(simt::DependentLaunchRequested());
    bool other_thread = true;
    std::thread([&] { other_thread = simt::DependentLaunchRequested(); }).join();
    EXPECT_FALSE(other_thread) << "a scope reached another thread";
  }
  EXPECT_FALSE(simt::DependentLaunchRequested());
}

TEST_F(SimtMisuse, WarpIntrinsicNotReachedByEveryLaneIsADeadlock) {
  simt::ScopedErrorCapture capture;
  DeviceArray<int> out(32);
  ASSERT_EQ(SIMT_LAUNCH(HalfWarpShuffle, dim3(1), dim3(32), 0, nullptr, out.get()), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_THAT(capture.Text(), HasSubstr("kernel 'HalfWarpShuffle'"));
  EXPECT_THAT(capture.Text(), HasSubstr("warp 0 lanes 0-15 wait at __shfl_xor_sync"));
  EXPECT_THAT(capture.Text(), HasSubstr("threads 16-31 have exited"));
}

TEST_F(SimtMisuse, WarpIntrinsicWithoutTheFullMaskIsRejected) {
  simt::ScopedErrorCapture capture;
  DeviceArray<int> out(32);
  ASSERT_EQ(SIMT_LAUNCH(PartialMaskShuffle, dim3(1), dim3(32), 0, nullptr, out.get()), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_THAT(capture.Text(), HasSubstr("kernel 'PartialMaskShuffle'"));
  EXPECT_THAT(capture.Text(), HasSubstr("__shfl_sync with mask 0x0000ffff"));
}

TEST(SimtMisuseDeathTest, DeadlockWithoutCaptureStopsTheProcessNamingTheKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        int* out = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&out), 64 * sizeof(int));
        SIMT_LAUNCH(EarlyExitBeforeBarrier, dim3(1), dim3(64), 0, nullptr, out);
        cudaDeviceSynchronize();
      },
      "kernel 'EarlyExitBeforeBarrier'.*deadlock");
}

#if defined(__SANITIZE_ADDRESS__)
// Device allocations and shared arrays are exactly sized heap blocks, so
// AddressSanitizer reports a kernel that overruns them.
__global__ void WriteOnePastTheEnd(int* out, int n) {
  if (threadIdx.x == 0) out[n] = 1;
}

__global__ void OverrunSharedArray(int* out) {
  SIMT_SHARED(int, values, 32);
  values[threadIdx.x] = 1;  // launched with 33 threads
  __syncthreads();
  out[threadIdx.x] = values[0];
}

TEST(SimtMisuseDeathTest, AsanReportsAKernelWritingPastADeviceAllocation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        int* out = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&out), 16 * sizeof(int));
        SIMT_LAUNCH(WriteOnePastTheEnd, dim3(1), dim3(32), 0, nullptr, out, 16);
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow");
}

TEST(SimtMisuseDeathTest, AsanReportsAKernelOverrunningASharedArray) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        int* out = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&out), 33 * sizeof(int));
        SIMT_LAUNCH(OverrunSharedArray, dim3(1), dim3(33), 0, nullptr, out);
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow");
}
#endif

TEST_F(SimtMisuse, LaunchLimitsOfTheGpuAreEnforced) {
  simt::ScopedErrorCapture capture;
  DeviceArray<int> out(2048);
  EXPECT_EQ(SIMT_LAUNCH(WriteIndex, dim3(1), dim3(1025), 0, nullptr, out.get(), 2048),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(SIMT_LAUNCH(WriteIndex, dim3(1), dim3(1, 1, 65), 0, nullptr, out.get(), 2048),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(SIMT_LAUNCH(WriteIndex, dim3(0), dim3(32), 0, nullptr, out.get(), 2048),
            cudaErrorInvalidConfiguration);
  // More than 48 KiB of dynamic shared memory needs the kernel's opt-in.
  const size_t big = 64 << 10;
  EXPECT_EQ(SIMT_LAUNCH(DynamicSharedCopy, dim3(1), dim3(64), big, nullptr, out.get()),
            cudaErrorInvalidValue);
  EXPECT_THAT(capture.Text(), HasSubstr("without cudaFuncSetAttribute"));
  ASSERT_CUDA(cudaFuncSetAttribute(DynamicSharedCopy, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(big)));
  ASSERT_EQ(SIMT_LAUNCH(DynamicSharedCopy, dim3(1), dim3(64), big, nullptr, out.get()),
            cudaSuccess);
  const std::vector<int> result = out.Download();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(result[i], 63 - i);
}

TEST_F(SimtMisuse, QueuedWorkRunsOnlyWhenTheHostSynchronises) {
  DeviceArray<int> device(64);
  int* pinned = nullptr;
  ASSERT_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(int)));
  for (int i = 0; i < 64; ++i) pinned[i] = -7;
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  ASSERT_EQ(SIMT_LAUNCH(WriteIndex, dim3(2), dim3(32), 0, stream, device.get(), 64), cudaSuccess);
  ASSERT_CUDA(
      cudaMemcpyAsync(pinned, device.get(), 64 * sizeof(int), cudaMemcpyDeviceToHost, stream));
  // Without a synchronisation, nothing has run: a missing sync shows in tests.
  for (int i = 0; i < 64; ++i) EXPECT_EQ(pinned[i], -7);
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(pinned[i], i);
  ASSERT_CUDA(cudaStreamDestroy(stream));
  ASSERT_CUDA(cudaFreeHost(pinned));
}

TEST_F(SimtMisuse, SynchronisingInsideAHostFunctionIsReportedNotAHang) {
  simt::ScopedErrorCapture capture;
  cudaError_t inner = cudaSuccess;
  ASSERT_CUDA(cudaLaunchHostFunc(
      nullptr, [](void* result) { *static_cast<cudaError_t*>(result) = cudaDeviceSynchronize(); },
      &inner));
  ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(inner, cudaErrorNotPermitted);
  EXPECT_THAT(capture.Text(), HasSubstr("inside queued work"));
}

TEST_F(SimtMisuse, FreshDeviceAndSharedMemoryIsPoisonedInEveryBlock) {
  DeviceArray<float> fresh(8);
  for (const float v : fresh.Download()) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    EXPECT_EQ(bits, 0xffffffffu);
  }
  // Each block, and each rerun, starts with 0xff shared memory, never the
  // values a previous block (here 12345) left.
  DeviceArray<int> out(4 * 64);
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(SIMT_LAUNCH(ReadSharedBeforeWriting, dim3(4), dim3(64), 0, nullptr, out.get()),
              cudaSuccess);
    EXPECT_EQ(out.Download(), std::vector<int>(4 * 64, -1)) << "run " << run;
  }
}

}  // namespace
}  // namespace switchserve::simt_test
