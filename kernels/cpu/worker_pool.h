// The CPU backend's threads: the calling thread plus `threads - 1` workers
// that share out the numbered pieces of one job: each thread runs its own
// share of consecutive pieces, then takes what is left of the others'.
//
// Why not an OpenMP parallel region: a region ends in a barrier that waits
// for every thread of the team, also one the OS has not scheduled yet. On a
// machine whose cores are shared (other processes, a container's CPU quota)
// each of the ~100 regions of a decode step can then wait a scheduler time
// slice. Here the caller takes pieces too and waits only for pieces already
// taken: a worker that wakes late finds the job done and takes nothing.
//
// Which thread runs a piece never changes what it computes (each piece owns
// its outputs). Run is called by one thread at a time (the backend is not
// thread-safe); workers spin briefly for the next job, then sleep.
#ifndef SWITCHSERVE_KERNELS_CPU_WORKER_POOL_H_
#define SWITCHSERVE_KERNELS_CPU_WORKER_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/pool_job_span.h"

namespace switchserve::cpu {

// Jobs aim for at least this many pieces per thread, so that uneven pieces
// (and a thread the OS runs late) even out.
inline constexpr int kPiecesPerThread = 4;

class WorkerPool {
 public:
  // `threads` >= 1 counts the caller: threads - 1 workers are started.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // No job is coming soon (the backend's step is over): idle workers stop
  // polling and sleep at once, leaving the cores to the process's other
  // threads (gRPC, the engine's bookkeeping). The next Run wakes them.
  void Rest();

  // Calls fn(context, i, slot) once for every i in [0, count), on the caller
  // (slot 0) and the workers (slots 1 .. threads - 1: a piece may use
  // per-slot scratch); returns when all calls have returned.
  using PieceFn = void (*)(const void* context, int piece, int slot);
  void Run(int count, PieceFn fn, const void* context);

  // From now on every pool of the process appends each job it shares out
  // (two pieces or more, on two threads or more) to `spans`, until called
  // with null; a job that runs while the list changes may be left out.
  // Off, it costs each job one atomic load.
  static void RecordJobs(std::vector<PoolJobSpan>* spans);

  // The same with any callable taking (piece, slot).
  template <typename Fn>
  void Run(int count, const Fn& fn) {
    Run(
        count, [](const void* c, int i, int slot) { (*static_cast<const Fn*>(c))(i, slot); }, &fn);
  }

 private:
  // A job's description; two alternate so that the next job can be written
  // while a late worker may still read the previous one (the cursor's
  // generation tells it the data went stale). Each on a cache line of its
  // own, apart from the cursor: the caller waits on `done` while the
  // workers take pieces from the cursor, and a line both write to moves
  // between their cores at every write (several hundred nanoseconds where
  // the cores do not share a cache).
  struct alignas(64) Job {
    std::atomic<PieceFn> fn{nullptr};
    std::atomic<const void*> context{nullptr};
    std::atomic<int> first{0};  // the number of the job's first piece
    std::atomic<int> done{0};
    // Whether RecordJobs was on when the job was published.
    std::atomic<bool> record{false};
    // If so: when the last worker that ran a piece had run its last
    // (PoolJobSpan::workers_end_ns).
    std::atomic<int64_t> workers_end_ns{0};
  };

  // The pieces a slot has yet to run of the job of `generation`: its share,
  // a run of consecutive pieces [lo, hi), in one atomic (generation << 32 |
  // lo << 16 | hi) so that a piece is taken only from the job it was read
  // for. The owner takes from the front; a slot whose own share is done
  // takes from the back. Each on a cache line of its own: a slot takes its
  // share without moving a line between cores, which costs several hundred
  // nanoseconds where the cores do not share a cache, until the last pieces.
  struct alignas(64) Share {
    std::atomic<uint64_t> value{0};
  };

  void WorkerLoop(int slot);
  // Ends every worker's loop and joins it.
  void StopWorkers();
  // Runs a job of at most kMaxPieces pieces, numbered from `first`.
  void RunPieces(int first, int count, PieceFn fn, const void* context);
  // Takes and runs pieces of the job of `generation`: its own share, then
  // what is left of the others'. Returns when none is left or a newer job
  // was published; the number of pieces it ran.
  int TakePieces(uint32_t generation, int slot);
  // Counts the `ran` pieces a slot ran as done; returns `ran`.
  int FinishTaking(Job& job, int slot, int ran);

  // generation << 32: publishes a job (and ends a polling worker's wait).
  alignas(64) std::atomic<uint64_t> cursor_{0};
  Job jobs_[2];
  std::vector<Share> shares_;  // one per slot
  // What a polling worker reads besides the cursor, written rarely: Run
  // writes resting_ only when it changes.
  alignas(64) std::atomic<bool> resting_{false};
  std::atomic<bool> stop_{false};
  // Idle workers sleep on wake_ (a job or stop ends their sleep).
  alignas(64) std::atomic<int> sleepers_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
};

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_WORKER_POOL_H_
