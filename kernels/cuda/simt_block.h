// The block runner of the SIMT executor: one per host thread, it runs one
// block at a time, the block's threads as Boost.Context fibers (see
// simt_executor.cc for the scheduling, simt_warp.cc for barriers and warp
// intrinsics). Internal to the executor.
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_BLOCK_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_BLOCK_H_

#include <cuda_runtime_api.h>

#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "kernels/cuda/simt_internal.h"

namespace simt::detail {
namespace ctx = boost::context;

// Thrown inside a fiber to stop its thread after a reported error.
struct KernelAbort {};

// A stack of the runner's pool, lent to one fiber at a time.
struct BorrowedStack {
  ctx::stack_context stack;
  ctx::stack_context allocate() { return stack; }
  void deallocate(ctx::stack_context&) noexcept {}
};

enum class State : uint8_t { kRunnable, kAtWarp, kAtBarrier, kDone };

struct GpuThread {
  uint3 idx = {0, 0, 0};
  int warp = 0;
  int lane = 0;
  State state = State::kRunnable;
  WarpOp op = WarpOp::kSyncWarp;  // what it waits at (kAtWarp)
  bool waited = false;            // has called SIMT_GRID_WAIT()
  ctx::fiber fiber;               // the thread, while suspended
  ctx::fiber scheduler;           // the scheduler, while the thread runs
  void* fake_stack = nullptr;     // ASan's, while the thread is switched out
};

struct Warp {
  int lanes = 0;    // lanes that exist (the last warp of a block may be short)
  int arrived = 0;  // lanes waiting at `op`
  WarpOp op = WarpOp::kSyncWarp;
  int bytes = 0;
  uint64_t value[32] = {};
  int arg[32] = {};
  int width[32] = {};
  uint64_t result[32] = {};
};

// Runs blocks on the host thread that owns it; one per host thread.
class BlockRunner {
 public:
  explicit BlockRunner(size_t stack_bytes) : stack_allocator_(stack_bytes) {}
  ~BlockRunner() {
    for (ctx::stack_context& stack : stacks_) stack_allocator_.deallocate(stack);
  }

  cudaError_t Run(const KernelLaunch& launch, uint3 block_idx, int64_t block_linear);

  int Barrier(BarrierOp op, int predicate, const std::source_location& site);
  uint64_t Exchange(WarpOp op, unsigned mask, uint64_t bits, int bytes, int arg, int width);
  void* dynamic_shared() {
    RequireWaited("SIMT_DYNAMIC_SHARED");
    return dynamic_shared_.get();
  }
  void* static_shared(const void* site, size_t bytes, size_t alignment);
  void GridWait() { running_->waited = true; }
  // Fails a thread of a dependent launch that reaches `what` before
  // SIMT_GRID_WAIT().
  void RequireWaited(const char* what);
  [[noreturn]] void Fail(const std::string& what);

 private:
  // Fiber side: back to the scheduler until it resumes this thread. Throws
  // KernelAbort when the block is abandoned meanwhile.
  void Yield(GpuThread& thread);
  // Scheduler side: runs thread i until it yields or finishes.
  void Resume(int i);
  void ThreadMain(int i);
  void Complete(Warp& warp);
  void MakeOrder(int64_t block_linear, int phase);
  // Resumes thread i, then the lanes of every warp that completes an
  // intrinsic meanwhile, until none can go on (or a barrier opens).
  void Step(int i);
  std::string Where() const;
  std::string DescribeDeadlock() const;
  cudaError_t Abandon();

  ctx::protected_fixedsize_stack stack_allocator_;
  std::vector<ctx::stack_context> stacks_;
  std::vector<GpuThread> threads_;
  std::vector<Warp> warps_;
  std::vector<int> order_;
  std::vector<std::vector<int>> warp_order_;  // order_ restricted to each warp
  int completed_warp_ = -1;                   // set by Complete
  int done_ = 0;                              // threads finished
  std::unique_ptr<unsigned char[]> dynamic_shared_;
  // This block's SIMT_SHARED arrays, each its own exactly sized heap block.
  struct SharedArray {
    const void* site;
    size_t bytes;
    std::unique_ptr<unsigned char[]> storage;
    void* data;
  };
  std::vector<SharedArray> shared_arrays_;
  const KernelLaunch* launch_ = nullptr;
  ThreadOrder thread_order_;
  GpuThread* running_ = nullptr;
  int n_ = 0;
  int barrier_arrived_ = 0;
  BarrierOp barrier_op_ = BarrierOp::kSync;
  std::source_location barrier_site_;  // where the first thread of this phase waits
  int barrier_value_ = 0;
  int barrier_result_ = 0;
  bool released_ = false;
  bool failed_ = false;
  bool abandoning_ = false;
  cudaError_t error_ = cudaSuccess;
  // The scheduler's stack, for ASan's stack-switch annotations.
  const void* scheduler_stack_bottom_ = nullptr;
  size_t scheduler_stack_size_ = 0;
};

// The runner of the calling host thread while it runs a block; aborts with
// `what` named when called outside a kernel.
BlockRunner& CurrentRunner(const char* what);
void SetCurrentRunner(BlockRunner* runner);

const char* OpName(WarpOp op);
const char* BarrierName(BarrierOp op);

}  // namespace simt::detail

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_BLOCK_H_
