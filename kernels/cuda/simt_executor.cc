// The SIMT executor: runs a grid's blocks in parallel on host threads, and a
// block's threads as Boost.Context fibers on one host thread. A fiber runs
// until it reaches __syncthreads (which waits for the whole block) or a warp
// intrinsic (which waits for its 32-lane warp only), then yields to the block's
// scheduler, which resumes the threads that can go on in the configured order.
// When a warp intrinsic completes, that warp runs on at once, as far as it
// can, before the next thread in the order: a warp may run ahead of the rest
// of its block on a GPU, and this exposes a shared value overwritten by one
// warp before another has read it. When no thread can go on and some have not
// finished, the block is deadlocked: the report says which threads wait where.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_block.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#endif

thread_local constinit uint3 threadIdx = {0, 0, 0};
thread_local constinit uint3 blockIdx = {0, 0, 0};
thread_local constinit dim3 blockDim{1, 1, 1};
thread_local constinit dim3 gridDim{1, 1, 1};

namespace simt::detail {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

thread_local BlockRunner* current_runner = nullptr;

constexpr char kNoWait[] =
    "a kernel launched with SIMT_LAUNCH_DEPENDENT did not call SIMT_GRID_WAIT()";

}  // namespace

BlockRunner& CurrentRunner(const char* what) {
  if (current_runner == nullptr) {
    std::fprintf(stderr, "simt: %s called outside a kernel\n", what);
    std::abort();
  }
  return *current_runner;
}

void SetCurrentRunner(BlockRunner* runner) { current_runner = runner; }

namespace {

std::string Dim(uint3 d) { return absl::StrCat("(", d.x, ",", d.y, ",", d.z, ")"); }

// "0-31, 64, 96-127" for ascending ids.
std::string Ranges(const std::vector<int>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(ids[i]);
    if (j > i) absl::StrAppend(&text, "-", ids[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace

cudaError_t BlockRunner::Run(const KernelLaunch& launch, uint3 block_idx, int64_t block_linear) {
  launch_ = &launch;
  thread_order_ = CurrentOrder();
  const dim3 block = launch.block;
  n_ = static_cast<int>(block.x * block.y * block.z);
  while (static_cast<int>(stacks_.size()) < n_) stacks_.push_back(stack_allocator_.allocate());
  threads_.resize(n_);
  const int n_warps = (n_ + kWarp - 1) / kWarp;
  warps_.assign(n_warps, Warp{});
  for (int w = 0; w < n_warps; ++w) warps_[w].lanes = std::min(kWarp, n_ - w * kWarp);
  for (int i = 0; i < n_; ++i) {
    GpuThread& t = threads_[i];
    // x fastest, as on the GPU: linear = x + y * bx + z * bx * by.
    t.idx = uint3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    t.warp = i / kWarp;
    t.lane = i % kWarp;
    t.state = State::kRunnable;
    t.waited = false;
    t.fiber = ctx::fiber(std::allocator_arg, BorrowedStack{stacks_[i]},
                         [this, i](ctx::fiber&& scheduler) {
                           threads_[i].scheduler = std::move(scheduler);
                           ThreadMain(i);
                           return std::move(threads_[i].scheduler);
                         });
  }
  if (launch.shared_bytes > 0) {
    // Poisoned like fresh device memory; exactly sized, so ASan sees overruns.
    dynamic_shared_.reset(new unsigned char[launch.shared_bytes]);
    std::memset(dynamic_shared_.get(), 0xff, launch.shared_bytes);
  } else {
    dynamic_shared_.reset();
  }
  shared_arrays_.clear();
  blockIdx = block_idx;
  blockDim = launch.block;
  gridDim = launch.grid;
  barrier_arrived_ = 0;
  released_ = false;
  failed_ = false;
  abandoning_ = false;
  error_ = cudaSuccess;
  int phase = 0;
  MakeOrder(block_linear, phase);

  SetCurrentRunner(this);
  done_ = 0;
  while (done_ < n_) {
    bool ran = false;
    for (int k = 0; k < n_ && !failed_; ++k) {
      if (threads_[order_[k]].state != State::kRunnable) continue;
      ran = true;
      Step(order_[k]);
      if (released_) {  // a barrier opened: the next phase starts over, in its order
        released_ = false;
        MakeOrder(block_linear, ++phase);
        k = -1;
      }
    }
    if (failed_) break;
    if (!ran && done_ < n_) {
      error_ = Report(cudaErrorLaunchFailure, absl::StrCat(Where(), ": ", DescribeDeadlock()));
      failed_ = true;
      break;
    }
  }
  if (failed_) return Abandon();
  SetCurrentRunner(nullptr);
  return cudaSuccess;
}

void BlockRunner::Step(int i) {
  completed_warp_ = -1;
  Resume(i);
  while (completed_warp_ >= 0 && !failed_ && !released_) {
    const int w = completed_warp_;
    completed_warp_ = -1;
    for (const int lane_thread : warp_order_[w]) {
      if (threads_[lane_thread].state != State::kRunnable) continue;
      Resume(lane_thread);
      if (failed_ || released_) return;
    }
  }
}

cudaError_t BlockRunner::Abandon() {
  // Every unfinished thread is resumed once more and unwinds (KernelAbort
  // from Yield), so a failed block leaves nothing behind for later launches.
  abandoning_ = true;
  for (int i = 0; i < n_; ++i) {
    if (threads_[i].state != State::kDone) Resume(i);
  }
  SetCurrentRunner(nullptr);
  return error_;
}

void BlockRunner::ThreadMain(int i) {
  GpuThread& me = threads_[i];
#if defined(SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom_, &scheduler_stack_size_);
#endif
  if (!abandoning_) {
    try {
      launch_->body->Run();
    } catch (const KernelAbort&) {
    }
  }
  me.state = State::kDone;
#if defined(SIMT_ASAN)
  // The last switch away from this stack: ASan may drop its fake frames.
  __sanitizer_start_switch_fiber(nullptr, scheduler_stack_bottom_, scheduler_stack_size_);
#endif
}

void BlockRunner::Resume(int i) {
  GpuThread& t = threads_[i];
  running_ = &t;
  threadIdx = t.idx;
#if defined(SIMT_ASAN)
  void* fake_stack = nullptr;
  const ctx::stack_context& stack = stacks_[i];
  __sanitizer_start_switch_fiber(&fake_stack, static_cast<char*>(stack.sp) - stack.size,
                                 stack.size);
#endif
  t.fiber = std::move(t.fiber).resume();
#if defined(SIMT_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  if (t.state == State::kDone) {
    ++done_;
    if (launch_->dependent && !t.waited && !failed_ && !abandoning_) {
      error_ =
          Report(cudaErrorLaunchFailure, absl::StrCat(Where(), ": ", kNoWait, " before its end"));
      failed_ = true;
    }
  }
  running_ = nullptr;
}

void BlockRunner::RequireWaited(const char* what) {
  if (launch_->dependent && !running_->waited) {
    Fail(absl::StrCat(kNoWait, " before ", what));
  }
}

void BlockRunner::Yield(GpuThread& thread) {
#if defined(SIMT_ASAN)
  __sanitizer_start_switch_fiber(&thread.fake_stack, scheduler_stack_bottom_,
                                 scheduler_stack_size_);
#endif
  thread.scheduler = std::move(thread.scheduler).resume();
#if defined(SIMT_ASAN)
  __sanitizer_finish_switch_fiber(thread.fake_stack, &scheduler_stack_bottom_,
                                  &scheduler_stack_size_);
#endif
  if (abandoning_) throw KernelAbort{};
}

void BlockRunner::MakeOrder(int64_t block_linear, int phase) {
  order_.resize(n_);
  for (int i = 0; i < n_; ++i) order_[i] = i;
  switch (thread_order_.order) {
    case Order::kForward:
      break;
    case Order::kReverse:
      std::reverse(order_.begin(), order_.end());
      break;
    case Order::kRandom: {
      uint64_t state = SplitMix(thread_order_.seed ^ SplitMix(static_cast<uint64_t>(block_linear)) ^
                                SplitMix(0x5157ull + static_cast<uint64_t>(phase)));
      for (int i = n_ - 1; i > 0; --i) {
        state = SplitMix(state);
        std::swap(order_[i], order_[static_cast<int>(state % static_cast<uint64_t>(i + 1))]);
      }
      break;
    }
  }
  warp_order_.assign(warps_.size(), {});
  for (const int i : order_) warp_order_[i / kWarp].push_back(i);
}

std::string BlockRunner::Where() const {
  std::string where =
      absl::StrCat("kernel '", launch_->name, "' block ", Dim(blockIdx), " of ",
                   Dim(uint3{launch_->grid.x, launch_->grid.y, launch_->grid.z}), ", block size ",
                   Dim(uint3{launch_->block.x, launch_->block.y, launch_->block.z}));
  if (running_ != nullptr) {
    absl::StrAppend(&where, ", thread ", Dim(running_->idx), " (warp ", running_->warp, ", lane ",
                    running_->lane, ")");
  }
  return where;
}

std::string BlockRunner::DescribeDeadlock() const {
  std::string text = absl::StrCat(
      "deadlock: a barrier or warp intrinsic is not reached by every thread it waits for (",
      ToString(thread_order_), " order)");
  std::vector<int> at_barrier;
  std::vector<int> exited;
  for (int i = 0; i < n_; ++i) {
    if (threads_[i].state == State::kAtBarrier) at_barrier.push_back(i);
    if (threads_[i].state == State::kDone) exited.push_back(i);
  }
  if (!at_barrier.empty()) {
    absl::StrAppend(&text, "; threads ", Ranges(at_barrier), " wait at ", BarrierName(barrier_op_));
  }
  for (size_t w = 0; w < warps_.size(); ++w) {
    std::vector<int> lanes;
    for (int lane = 0; lane < warps_[w].lanes; ++lane) {
      if (threads_[w * kWarp + lane].state == State::kAtWarp) lanes.push_back(lane);
    }
    if (!lanes.empty()) {
      absl::StrAppend(&text, "; warp ", w, " lanes ", Ranges(lanes), " wait at ",
                      OpName(warps_[w].op));
    }
  }
  if (!exited.empty()) absl::StrAppend(&text, "; threads ", Ranges(exited), " have exited");
  return text;
}

void* BlockRunner::static_shared(const void* site, size_t bytes, size_t alignment) {
  RequireWaited("SIMT_SHARED");
  for (const SharedArray& array : shared_arrays_) {
    if (array.site == site) {
      if (array.bytes != bytes) Fail("SIMT_SHARED array declared with two different sizes");
      return array.data;
    }
  }
  // Exactly `bytes` past the aligned start, so that ASan sees an overrun;
  // filled with 0xff like fresh device memory: a read before any write shows.
  const size_t pad = alignment > 16 ? alignment : 0;
  std::unique_ptr<unsigned char[]> storage(new unsigned char[bytes + pad]);
  unsigned char* data = storage.get();
  if (pad != 0) {
    const auto address = reinterpret_cast<uintptr_t>(data);
    data += (alignment - address % alignment) % alignment;
  }
  std::memset(data, 0xff, bytes);
  shared_arrays_.push_back(SharedArray{site, bytes, std::move(storage), data});
  return data;
}

void BlockRunner::Fail(const std::string& what) {
  error_ = Report(cudaErrorLaunchFailure, absl::StrCat(Where(), ": ", what));
  failed_ = true;
  throw KernelAbort{};
}

// ---- Entry points from kernels (simt_device.h) ----------------------------------

void GridWait() { CurrentRunner("SIMT_GRID_WAIT").GridWait(); }

void* DynamicShared() { return CurrentRunner("SIMT_DYNAMIC_SHARED").dynamic_shared(); }

void* StaticShared(const void* site, size_t bytes, size_t alignment) {
  return CurrentRunner("SIMT_SHARED").static_shared(site, bytes, alignment);
}

BlockRunner& ThisThreadRunner() {
  thread_local std::unique_ptr<BlockRunner> runner;
  if (runner == nullptr) runner = std::make_unique<BlockRunner>(StackBytes());
  return *runner;
}

cudaError_t RunBlock(BlockRunner& runner, const KernelLaunch& launch, uint3 block_idx,
                     int64_t block_linear) {
  return runner.Run(launch, block_idx, block_linear);
}

}  // namespace simt::detail
