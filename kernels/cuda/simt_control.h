// Knobs of the SIMT executor, for tests and tools of the emulated build only
// (nothing here exists in an nvcc build). Plain C++; no CUDA types.
//
// Environment, read at the first launch:
//   SWITCHSERVE_SIMT_ORDER=forward|reverse|random:SEED   thread order (forward)
//   SWITCHSERVE_SIMT_THREADS=N       host threads running blocks (hardware, >= 2)
//   SWITCHSERVE_SIMT_STACK_KIB=N     fiber stack per GPU thread (64; 256 under ASan)
//   SWITCHSERVE_SIMT_WATCHDOG_S=N    abort a launch running longer (300; 0 = off)
#ifndef SWITCHSERVE_KERNELS_CUDA_SIMT_CONTROL_H_
#define SWITCHSERVE_KERNELS_CUDA_SIMT_CONTROL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace simt {

// The order in which a block's threads run between two barriers (and in which
// blocks are handed to host threads). Forward runs thread 0 first, so it
// exposes a thread reading a higher thread's value before a missing barrier;
// reverse exposes reads of lower threads' values; random (a permutation per
// barrier phase, seeded by SEED and the block index) exposes both, and any
// order dependence. Results must be bitwise equal under all three.
enum class Order { kForward, kReverse, kRandom };
struct ThreadOrder {
  Order order = Order::kForward;
  uint64_t seed = 0;  // kRandom only
  bool operator==(const ThreadOrder&) const = default;
};
// "forward", "reverse", "random:SEED"; false on anything else.
bool ParseThreadOrder(std::string_view text, ThreadOrder* out);
std::string ToString(const ThreadOrder& order);

// The order of later launches (process-wide; set between launches).
void SetThreadOrder(const ThreadOrder& order);
ThreadOrder GetThreadOrder();

// By default a misuse the executor finds (a host pointer as kernel argument,
// a copy whose direction contradicts its pointers, use after free, a barrier
// not reached by every thread, a bad warp mask, ...) is printed to stderr,
// naming the kernel and argument, and the process aborts. While a
// ScopedErrorCapture lives, errors are collected instead: the runtime call
// that found the error returns its cudaError_t (a failing launch is reported
// by cudaGetLastError or the next synchronisation, as on a GPU), the failing
// block stops, and its stuck fibers are unwound so later launches work.
// One capture at a time; process-wide.
class ScopedErrorCapture {
 public:
  ScopedErrorCapture();
  ~ScopedErrorCapture();
  ScopedErrorCapture(const ScopedErrorCapture&) = delete;
  ScopedErrorCapture& operator=(const ScopedErrorCapture&) = delete;

  // The messages reported so far, oldest first.
  std::vector<std::string> messages() const;
  // All messages, one per line ("" when none).
  std::string Text() const;
};

// Device allocations (cudaMalloc) not yet freed: count and bytes.
struct MemoryUsage {
  int64_t allocations = 0;
  int64_t bytes = 0;
};
MemoryUsage DeviceMemoryInUse();

}  // namespace simt

#endif  // SWITCHSERVE_KERNELS_CUDA_SIMT_CONTROL_H_
