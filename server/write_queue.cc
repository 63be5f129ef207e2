#include "server/write_queue.h"

#include <pthread.h>

#include <utility>

namespace switchserve {

WriteQueue::WriteQueue() : thread_([this] { Loop(); }) {}

WriteQueue::WriteQueue(std::chrono::steady_clock::duration period, std::function<void()> tick)
    : period_(period), tick_(std::move(tick)) {
  // Started here, once period_ and tick_ are set.
  thread_ = std::thread([this] { Loop(); });
}

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
  auto next_tick = std::chrono::steady_clock::now() + period_;
  for (;;) {
    bool tick = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stopping_ || !queue_.empty(); };
      if (tick_) {
        tick = !wake_.wait_until(lock, next_tick, ready);
      } else {
        wake_.wait(lock, ready);
      }
      if (!tick && queue_.empty()) return;  // stopping, and nothing left to run
      batch.swap(queue_);
    }
    for (QueuedWrite* write : batch) write->RunQueuedWrite();
    batch.clear();
    if (tick_ && std::chrono::steady_clock::now() >= next_tick) {
      tick_();
      next_tick = std::chrono::steady_clock::now() + period_;
    }
  }
}

}  // namespace switchserve
