// A thread that starts streaming calls' writes for the engine: the engine
// thread only merges an update into a call's pending message and posts the
// call here; the message is serialized and handed to gRPC (which may write to
// the socket right away, on the calling thread) on this thread, so the engine
// goes on with its next step. Calls posted while the thread is busy are
// written in one pass, each with everything pending for it by then.
//
// It also runs a periodic task, when given one (the service's check for
// streams whose client stopped reading).
//
// Thread-safe.
#ifndef SWITCHSERVE_SERVER_WRITE_QUEUE_H_
#define SWITCHSERVE_SERVER_WRITE_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace switchserve {

// What the queue runs: a call's write step.
class QueuedWrite {
 public:
  virtual ~QueuedWrite() = default;
  virtual void RunQueuedWrite() = 0;
};

class WriteQueue {
 public:
  WriteQueue();
  // Also runs `tick` on the thread every `period` (> 0), between batches.
  WriteQueue(std::chrono::steady_clock::duration period, std::function<void()> tick);
  // Runs what is still queued, then joins the thread.
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // `write` (which must stay valid until it has run) runs once on the queue's
  // thread, after everything posted before it.
  void Post(QueuedWrite* write);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<QueuedWrite*> queue_;
  bool stopping_ = false;
  const std::chrono::steady_clock::duration period_{};
  const std::function<void()> tick_;  // empty: none
  std::thread thread_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_WRITE_QUEUE_H_
