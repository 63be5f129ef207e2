#include "server/write_queue.h"

#include <pthread.h>

namespace switchserve {

WriteQueue::WriteQueue() : thread_([this] { Loop(); }) {}

WriteQueue::~WriteQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void WriteQueue::Post(QueuedWrite* write) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = queue_.empty();
    queue_.push_back(write);
  }
  // A non-empty queue means the thread is awake or about to look again.
  if (was_empty) wake_.notify_one();
}

void WriteQueue::Loop() {
  pthread_setname_np(pthread_self(), "stream-writes");
  std::vector<QueuedWrite*> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      batch.swap(queue_);
    }
    for (QueuedWrite* write : batch) write->RunQueuedWrite();
    batch.clear();
  }
}

}  // namespace switchserve
