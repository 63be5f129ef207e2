#include "kernels/cpu/worker_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/runtime/compute_threads.h"

namespace switchserve::cpu {
namespace {

// How long an idle worker polls for the next job before it sleeps: longer
// than the gaps between the parallel parts of a step, short enough not to
// hold a core the engine's other threads (gRPC) could use between steps.
constexpr std::chrono::microseconds kSpinFor(50);

inline void Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// RecordJobs' list: null, or where every pool appends its jobs (under the
// mutex: tests run pools side by side).
std::atomic<std::vector<PoolJobSpan>*> recorded_jobs{nullptr};
std::mutex recorded_jobs_mutex;

constexpr uint32_t Generation(uint64_t value) { return static_cast<uint32_t>(value >> 32); }

// A job's pieces are numbered in 16 bits (Share); longer jobs run as several.
constexpr int kMaxPieces = 0xFFFF;

constexpr uint64_t PackShare(uint32_t generation, int lo, int hi) {
  return uint64_t{generation} << 32 | static_cast<uint64_t>(lo) << 16 | static_cast<uint64_t>(hi);
}
constexpr int Lo(uint64_t share) { return static_cast<int>((share >> 16) & 0xFFFF); }
constexpr int Hi(uint64_t share) { return static_cast<int>(share & 0xFFFF); }

}  // namespace

WorkerPool::WorkerPool(int threads) : shares_(std::max(threads, 1)) {
  // Compute threads (engine/runtime/compute_threads.h), listed by the time
  // the pool exists. A thread the system refuses to create (a thread limit:
  // std::system_error) ends the construction with the workers started before
  // it stopped and joined: destroyed running, they ended the process
  // (std::terminate) instead of the error reaching the caller.
  try {
    for (int slot = 1; slot < threads; ++slot) {
      workers_.push_back(StartComputeThread([this, slot] { WorkerLoop(slot); }));
    }
  } catch (...) {
    StopWorkers();
    throw;
  }
}

WorkerPool::~WorkerPool() { StopWorkers(); }

void WorkerPool::StopWorkers() {
  stop_.store(true);
  cursor_.fetch_add(uint64_t{1} << 32);  // a new generation ends every worker's wait
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  for (std::thread& worker : workers_) worker.join();
}

void WorkerPool::RecordJobs(std::vector<PoolJobSpan>* spans) {
  std::lock_guard<std::mutex> lock(recorded_jobs_mutex);
  recorded_jobs.store(spans, std::memory_order_relaxed);
}

void WorkerPool::Rest() {
  if (!resting_.load(std::memory_order_relaxed)) resting_.store(true, std::memory_order_relaxed);
}

void WorkerPool::Run(int count, PieceFn fn, const void* context) {
  if (count <= 0) return;
  if (resting_.load(std::memory_order_relaxed)) resting_.store(false, std::memory_order_relaxed);
  if (workers_.empty() || count == 1) {
    for (int i = 0; i < count; ++i) fn(context, i, 0);
    return;
  }
  for (int first = 0; first < count; first += kMaxPieces) {
    RunPieces(first, std::min(kMaxPieces, count - first), fn, context);
  }
}

void WorkerPool::RunPieces(int first, int count, PieceFn fn, const void* context) {
  const bool record = recorded_jobs.load(std::memory_order_relaxed) != nullptr;
  const int64_t start_ns = record ? SteadyNowNs() : 0;
  const uint32_t generation = Generation(cursor_.load(std::memory_order_relaxed)) + 1;
  Job& job = jobs_[generation & 1];
  job.fn.store(fn, std::memory_order_relaxed);
  job.context.store(context, std::memory_order_relaxed);
  job.first.store(first, std::memory_order_relaxed);
  job.done.store(0, std::memory_order_relaxed);
  job.record.store(record, std::memory_order_relaxed);
  if (record) job.workers_end_ns.store(0, std::memory_order_relaxed);
  // Each slot's own consecutive pieces. Every piece of the last job has run
  // (Run waited for them), so a worker still looking at it finds a newer
  // generation here and takes nothing.
  const int threads = this->threads();
  for (int slot = 0; slot < threads; ++slot) {
    shares_[slot].value.store(
        PackShare(generation, count * slot / threads, count * (slot + 1) / threads),
        std::memory_order_relaxed);
  }
  cursor_.store(uint64_t{generation} << 32);  // publishes the job (seq_cst: see WorkerLoop)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  const int ran = TakePieces(generation, 0);
  const int64_t caller_end_ns = record ? SteadyNowNs() : 0;
  // Only pieces a worker has taken can still be running.
  while (job.done.load(std::memory_order_acquire) < count) Relax();
  if (record) {
    const int64_t end_ns = SteadyNowNs();
    const int64_t workers_end_ns = job.workers_end_ns.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(recorded_jobs_mutex);
    if (std::vector<PoolJobSpan>* spans = recorded_jobs.load(std::memory_order_relaxed)) {
      spans->push_back({start_ns, end_ns, count, ran, caller_end_ns, workers_end_ns});
    }
  }
}

int WorkerPool::TakePieces(uint32_t generation, int slot) {
  Job& job = jobs_[generation & 1];
  const int threads = this->threads();
  int ran = 0;
  // Its own pieces from the front, then each other slot's from the back.
  for (int k = 0; k < threads; ++k) {
    const int from = (slot + k) % threads;
    Share& share = shares_[from];
    uint64_t value = share.value.load(std::memory_order_acquire);
    for (;;) {
      if (Generation(value) != generation) return FinishTaking(job, slot, ran);
      const int lo = Lo(value), hi = Hi(value);
      if (lo >= hi) break;
      const int piece = k == 0 ? lo : hi - 1;
      const uint64_t taken =
          k == 0 ? PackShare(generation, lo + 1, hi) : PackShare(generation, lo, hi - 1);
      if (!share.value.compare_exchange_weak(value, taken, std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
        continue;
      }
      // Read under the share's generation: the job cannot change before
      // this piece is counted done.
      job.fn.load(std::memory_order_relaxed)(job.context.load(std::memory_order_relaxed),
                                             job.first.load(std::memory_order_relaxed) + piece,
                                             slot);
      ++ran;
      value = share.value.load(std::memory_order_acquire);
    }
  }
  return FinishTaking(job, slot, ran);
}

int WorkerPool::FinishTaking(Job& job, int slot, int ran) {
  if (ran > 0 && slot > 0 && job.record.load(std::memory_order_relaxed)) {
    const int64_t now = SteadyNowNs();
    int64_t latest = job.workers_end_ns.load(std::memory_order_relaxed);
    while (latest < now &&
           !job.workers_end_ns.compare_exchange_weak(latest, now, std::memory_order_relaxed)) {
    }
  }
  // One add for every piece this thread ran, once it has taken its last:
  // the caller spins on `done`, and each add takes the line from it. No
  // newer job can be published before this add (Run waits for it).
  if (ran > 0) job.done.fetch_add(ran, std::memory_order_release);
  return ran;
}

void WorkerPool::WorkerLoop(int slot) {
  pthread_setname_np(pthread_self(), ("cpu-worker-" + std::to_string(slot)).substr(0, 15).c_str());
  // Generation 0 has no job: a worker that starts late must still take part
  // in the first one, so it does not read the current generation as seen.
  uint32_t seen = 0;
  for (;;) {
    uint64_t cursor = cursor_.load(std::memory_order_acquire);
    auto spin_start = std::chrono::steady_clock::now();
    int polls = 0;
    // stop_ is checked too: a worker that starts after StopWorkers bumped
    // the generation reads the bumped one as already seen.
    while (Generation(cursor) == seen && !stop_.load(std::memory_order_relaxed)) {
      const bool poll =
          !resting_.load(std::memory_order_relaxed) &&
          (++polls % 64 != 0 || std::chrono::steady_clock::now() - spin_start < kSpinFor);
      if (poll) {
        Relax();
      } else {
        // Either Run's store of the cursor comes first and the predicate
        // holds at once, or our increment does and Run sees a sleeper to
        // wake (both seq_cst); the wake is sent under the mutex, so it cannot
        // fall between the predicate and the wait.
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return Generation(cursor_.load()) != seen || stop_.load(); });
        sleepers_.fetch_sub(1);
        spin_start = std::chrono::steady_clock::now();
      }
      cursor = cursor_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = Generation(cursor);
    TakePieces(seen, slot);
  }
}

}  // namespace switchserve::cpu
