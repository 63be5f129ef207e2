// Barriers and warp intrinsics of the SIMT executor. A thread that reaches
// one records its operand and yields; the last thread of the block
// (__syncthreads) or of the warp (the *_sync intrinsics) to arrive computes
// every participant's result and makes them runnable. Warp intrinsics follow
// the PTX definitions (shfl's clamp and segment rules, votes over the lanes
// that exist).
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_block.h"

namespace simt::detail {

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

namespace {

bool SameSite(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         std::strcmp(a.file_name(), b.file_name()) == 0;
}

// "norm.cu:42".
std::string SiteName(const std::source_location& site) {
  const char* file = site.file_name();
  const char* slash = std::strrchr(file, '/');
  return absl::StrCat(slash != nullptr ? slash + 1 : file, ":", site.line());
}

}  // namespace

int BlockRunner::Barrier(BarrierOp op, int predicate, const std::source_location& site) {
  RequireWaited(BarrierName(op));
  GpuThread& t = *running_;
  const int bit = predicate != 0 ? 1 : 0;
  if (barrier_arrived_ == 0) {
    barrier_op_ = op;
    barrier_site_ = site;
    barrier_value_ = op == BarrierOp::kAnd ? 1 : 0;
  } else if (op != barrier_op_) {
    Fail(absl::StrCat(BarrierName(op), " while other threads wait at ", BarrierName(barrier_op_)));
  } else if (!SameSite(site, barrier_site_)) {
    // On a GPU a barrier in code that not every thread of the block runs is
    // undefined; here the two would release each other.
    Fail(absl::StrCat(BarrierName(op), " at ", SiteName(site), " while other threads wait at ",
                      BarrierName(barrier_op_), " at ", SiteName(barrier_site_),
                      ": every thread of a block waits at the same barrier "
                      "(kernels/cuda/README.md)"));
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
  RequireWaited(OpName(op));
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

int BlockBarrier(BarrierOp op, int predicate, const std::source_location& site) {
  return CurrentRunner(BarrierName(op)).Barrier(op, predicate, site);
}

uint64_t WarpExchange(WarpOp op, unsigned mask, uint64_t bits, int bytes, int arg, int width) {
  return CurrentRunner(OpName(op)).Exchange(op, mask, bits, bytes, arg, width);
}

}  // namespace simt::detail
