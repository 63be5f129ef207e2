#include "server/http/render_threads.h"

#include <pthread.h>

#include <utility>

namespace switchserve {

RenderThreads::RenderThreads(int threads) {
  // A thread the system refuses to create (std::system_error) ends the
  // construction with those started before it stopped and joined: destroyed
  // running, they ended the process (std::terminate).
  try {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  } catch (...) {
    Stop();
    throw;
  }
}

RenderThreads::~RenderThreads() { Stop(); }

void RenderThreads::Post(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(work));
      wake_.notify_one();
      return;
    }
  }
  work();  // stopped: on the caller's thread rather than never
}

void RenderThreads::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void RenderThreads::Loop() {
  pthread_setname_np(pthread_self(), "http-render");  // as `top -H` shows it
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace switchserve
