// One job a CPU worker pool shared out (WorkerPool::RecordJobs), for a
// timeline of the backend's parallel work (engine_bench --pool-timeline,
// through kernels/backends.h).
#ifndef SWITCHSERVE_KERNELS_CPU_POOL_JOB_SPAN_H_
#define SWITCHSERVE_KERNELS_CPU_POOL_JOB_SPAN_H_

#include <chrono>
#include <cstdint>

namespace switchserve::cpu {

// When Run published the job and when its last piece had finished (steady
// clock, nanoseconds), its pieces, and how many of them the calling thread
// ran; when the calling thread had run its last piece, and when the last
// worker that ran any had (0: none did). Between the first of those two and
// end_ns a thread had no piece left to take: the job's pieces did not come
// out even.
struct PoolJobSpan {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int pieces = 0;
  int caller_pieces = 0;
  int64_t caller_end_ns = 0;
  int64_t workers_end_ns = 0;
};

// Now on the clock of PoolJobSpan's times.
inline int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_POOL_JOB_SPAN_H_
