// Internal interfaces between the parts of the SIMT executor's runtime
// (simt_errors.cc, simt_memory.cc, simt_stream.cc, simt_executor.cc,
// simt_runtime.cc). Not for kernels or tests.
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_INTERNAL_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_INTERNAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/cuda/simt.h"
#include "kernels/cuda/simt_control.h"

namespace simt::detail {

// ---- Errors (simt_errors.cc) ----------------------------------------------

// Reports a misuse: prints it and aborts, or, under a ScopedErrorCapture,
// records it. Returns `code` for the caller to return.
cudaError_t Report(cudaError_t code, const std::string& message);
// The calling host thread's last error (cudaGetLastError's state).
void SetLastError(cudaError_t code);
cudaError_t TakeLastError();
cudaError_t PeekLastError();
// Errors of queued work, reported at the next synchronisation.
void SetPendingError(cudaError_t code);
cudaError_t TakePendingError();
std::string FormatPointer(const void* p);
std::string Demangle(const char* mangled);

// ---- Memory (simt_memory.cc) ----------------------------------------------

enum class MemoryKind { kUnknown, kDevice, kFreedDevice, kPinnedHost };
struct MemoryRegion {
  MemoryKind kind = MemoryKind::kUnknown;
  const char* base = nullptr;
  int64_t size = 0;
  int64_t id = 0;  // allocation number, 1-based, in cudaMalloc order
};
// What `p` points into. A pointer one past the end of an allocation counts as
// inside it (an empty range at the end is a valid argument).
MemoryRegion FindRegion(const void* p);
// "device allocation #3 (4096 bytes) at +128", "freed device allocation ...",
// "host memory".
std::string DescribeRegion(const void* p);
// "" when [p, p + bytes) lies inside one live device allocation; else why not.
std::string CheckDeviceRange(const void* p, int64_t bytes);

// ---- Streams (simt_stream.cc) ----------------------------------------------

// Work queued on a stream runs in issue order at the next synchronisation
// (stream, event or device synchronize, a synchronous copy, cudaFree...), all
// streams in one issue-ordered queue: queued work never runs before the host
// asks for it, so a missing synchronisation leaves results unwritten.
// `work` returns cudaSuccess or the error it reported.
void Enqueue(cudaStream_t stream, std::function<cudaError_t()> work);
// Runs everything queued; returns the first error of the queued work.
cudaError_t Drain();
bool IsValidStream(cudaStream_t stream);

// ---- Executor (simt_executor.cc) -------------------------------------------

struct KernelLaunch {
  std::string name;
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  bool dependent = false;  // SIMT_LAUNCH_DEPENDENT: threads call SIMT_GRID_WAIT() first
  std::unique_ptr<const KernelBody> body;
};
// Runs every block of the launch; cudaSuccess or the error reported.
cudaError_t RunGrid(const KernelLaunch& launch);

// Runs one block on the calling host thread, with that thread's runner (its
// fiber stacks are kept for the thread's lifetime).
class BlockRunner;
BlockRunner& ThisThreadRunner();
cudaError_t RunBlock(BlockRunner& runner, const KernelLaunch& launch, uint3 block_idx,
                     int64_t block_linear);

// Configuration (environment, see simt_control.h), read once.
int HostThreads();
size_t StackBytes();
ThreadOrder CurrentOrder();

}  // namespace simt::detail

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_INTERNAL_H_
