// The threads that compute steps (the engine thread and a backend's workers)
// say so here while they run, so that a server can run every other thread at
// a lower priority (server/thread_priority.h).
#ifndef SWITCHSERVE_ENGINE_RUNTIME_COMPUTE_THREADS_H_
#define SWITCHSERVE_ENGINE_RUNTIME_COMPUTE_THREADS_H_

#include <sys/types.h>

#include <functional>
#include <thread>
#include <vector>

namespace switchserve {

// Lists the calling thread as a compute thread for the object's lifetime.
// Create it first thing in the thread's function.
class ComputeThreadScope {
 public:
  ComputeThreadScope();
  ~ComputeThreadScope();
  ComputeThreadScope(const ComputeThreadScope&) = delete;
  ComputeThreadScope& operator=(const ComputeThreadScope&) = delete;

 private:
  pid_t tid_;
};

// Starts a thread that runs `body` as a compute thread; returns once the
// thread is listed (server/thread_priority.h relies on that).
std::thread StartComputeThread(std::function<void()> body);

// The kernel thread ids of the compute threads running now.
std::vector<pid_t> ComputeThreadIds();

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_COMPUTE_THREADS_H_
