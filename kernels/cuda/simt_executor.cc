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
#include <cuda_runtime_api.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#endif

thread_local constinit uint3 threadIdx = {0, 0, 0};
thread_local constinit uint3 blockIdx = {0, 0, 0};
thread_local constinit dim3 blockDim{1, 1, 1};
thread_local constinit dim3 gridDim{1, 1, 1};

namespace simt::detail {
namespace ctx = boost::context;

namespace {

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

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// Runs blocks on the host thread that owns it; one per host thread.
class BlockRunner {
 public:
  explicit BlockRunner(size_t stack_bytes) : stack_allocator_(stack_bytes) {}
  ~BlockRunner() {
    for (ctx::stack_context& stack : stacks_) stack_allocator_.deallocate(stack);
  }

  cudaError_t Run(const KernelLaunch& launch, uint3 block_idx, int64_t block_linear);

  int Barrier(BarrierOp op, int predicate);
  uint64_t Exchange(WarpOp op, unsigned mask, uint64_t bits, int bytes, int arg, int width);
  void* dynamic_shared() { return dynamic_shared_.get(); }
  void* static_shared(const void* site, size_t bytes, size_t alignment);
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

namespace {

thread_local BlockRunner* current_runner = nullptr;

BlockRunner& Runner(const char* what) {
  if (current_runner == nullptr) {
    std::fprintf(stderr, "simt: %s called outside a kernel\n", what);
    std::abort();
  }
  return *current_runner;
}

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncWarp:
      return "__syncwarp";
    case WarpOp::kShfl:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAll:
      return "__all_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kMatchAny:
      return "__match_any_sync";
  }
  return "?";
}

const char* BarrierName(BarrierOp op) {
  switch (op) {
    case BarrierOp::kSync:
      return "__syncthreads";
    case BarrierOp::kCount:
      return "__syncthreads_count";
    case BarrierOp::kAnd:
      return "__syncthreads_and";
    case BarrierOp::kOr:
      return "__syncthreads_or";
  }
  return "?";
}

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

  current_runner = this;
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
  current_runner = nullptr;
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
  current_runner = nullptr;
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
  running_ = nullptr;
  if (t.state == State::kDone) ++done_;
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

int BlockRunner::Barrier(BarrierOp op, int predicate) {
  GpuThread& t = *running_;
  const int bit = predicate != 0 ? 1 : 0;
  if (barrier_arrived_ == 0) {
    barrier_op_ = op;
    barrier_value_ = op == BarrierOp::kAnd ? 1 : 0;
  } else if (op != barrier_op_) {
    Fail(absl::StrCat(BarrierName(op), " while other threads wait at ", BarrierName(barrier_op_)));
  }
  switch (op) {
    case BarrierOp::kSync:
      break;
    case BarrierOp::kCount:
      barrier_value_ += bit;
      break;
    case BarrierOp::kAnd:
      barrier_value_ &= bit;
      break;
    case BarrierOp::kOr:
      barrier_value_ |= bit;
      break;
  }
  t.state = State::kAtBarrier;
  if (++barrier_arrived_ == n_) {
    for (GpuThread& other : threads_) other.state = State::kRunnable;
    barrier_arrived_ = 0;
    barrier_result_ = barrier_value_;
    released_ = true;
  }
  Yield(t);
  return barrier_result_;
}

uint64_t BlockRunner::Exchange(WarpOp op, unsigned mask, uint64_t bits, int bytes, int arg,
                               int width) {
  GpuThread& t = *running_;
  Warp& warp = warps_[t.warp];
  if (mask != kFullMask) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  "%s with mask 0x%08x: every warp intrinsic runs on all 32 lanes with the full "
                  "mask (kernels/cuda/README.md)",
                  OpName(op), mask);
    Fail(text);
  }
  if (width < 1 || width > kWarp || (width & (width - 1)) != 0) {
    Fail(absl::StrCat(OpName(op), " with width ", width, ": width is a power of two from 1 to 32"));
  }
  if (warp.arrived == 0) {
    warp.op = op;
    warp.bytes = bytes;
  } else if (warp.op != op || warp.bytes != bytes) {
    Fail(absl::StrCat(OpName(op), " (", bytes, " bytes) while other lanes of warp ", t.warp,
                      " wait at ", OpName(warp.op), " (", warp.bytes, " bytes)"));
  }
  warp.value[t.lane] = bits;
  warp.arg[t.lane] = arg;
  warp.width[t.lane] = width;
  t.state = State::kAtWarp;
  t.op = op;
  if (++warp.arrived == warp.lanes) Complete(warp);
  Yield(t);
  return warp.result[t.lane];
}

void BlockRunner::Complete(Warp& warp) {
  // A lane that does not exist (short last warp) reads as all ones: undefined
  // on a GPU, and visibly wrong here.
  const uint64_t poison = warp.bytes >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * warp.bytes)) - 1;
  auto value_of = [&](int lane) { return lane < warp.lanes ? warp.value[lane] : poison; };
  uint64_t vote = 0;
  bool all = true;
  for (int lane = 0; lane < warp.lanes; ++lane) {
    if (warp.value[lane] != 0) vote |= uint64_t{1} << lane;
    all = all && warp.value[lane] != 0;
  }
  const int warp_index = static_cast<int>(&warp - warps_.data());
  for (int lane = 0; lane < warp.lanes; ++lane) {
    // PTX shfl: only the low 5 bits of the lane operand count; a segment of
    // `width` lanes starts at `base` and ends at `last`.
    const int width = warp.width[lane];
    const int arg = warp.arg[lane] & 31;
    const int base = lane & ~(width - 1);
    const int last = base + width - 1;
    int src = lane;
    switch (warp.op) {
      case WarpOp::kSyncWarp:
        warp.result[lane] = 0;
        break;
      case WarpOp::kShfl:
        src = base + (arg & (width - 1));
        warp.result[lane] = value_of(src);
        break;
      case WarpOp::kShflUp:
        src = lane - arg >= base ? lane - arg : lane;
        warp.result[lane] = value_of(src);
        break;
      case WarpOp::kShflDown:
        src = lane + arg <= last ? lane + arg : lane;
        warp.result[lane] = value_of(src);
        break;
      case WarpOp::kShflXor:
        src = (lane ^ arg) <= last ? (lane ^ arg) : lane;
        warp.result[lane] = value_of(src);
        break;
      case WarpOp::kBallot:
        warp.result[lane] = vote;
        break;
      case WarpOp::kAll:
        warp.result[lane] = all ? 1 : 0;
        break;
      case WarpOp::kAny:
        warp.result[lane] = vote != 0 ? 1 : 0;
        break;
      case WarpOp::kMatchAny: {
        uint64_t peers = 0;
        for (int other = 0; other < warp.lanes; ++other) {
          if (warp.value[other] == warp.value[lane]) peers |= uint64_t{1} << other;
        }
        warp.result[lane] = peers;
        break;
      }
    }
    threads_[warp_index * kWarp + lane].state = State::kRunnable;
  }
  warp.arrived = 0;
  completed_warp_ = warp_index;
}

// ---- Entry points from kernels (simt_device.h) ----------------------------------

int BlockBarrier(BarrierOp op, int predicate) {
  return Runner(BarrierName(op)).Barrier(op, predicate);
}

uint64_t WarpExchange(WarpOp op, unsigned mask, uint64_t bits, int bytes, int arg, int width) {
  return Runner(OpName(op)).Exchange(op, mask, bits, bytes, arg, width);
}

void* DynamicShared() { return Runner("SIMT_DYNAMIC_SHARED").dynamic_shared(); }

void* StaticShared(const void* site, size_t bytes, size_t alignment) {
  return Runner("SIMT_SHARED").static_shared(site, bytes, alignment);
}

void KernelError(const char* message) { Runner("KernelError").Fail(message); }

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
