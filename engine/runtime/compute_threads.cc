#include "engine/runtime/compute_threads.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <utility>

namespace switchserve {
namespace {

std::mutex& Mutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::vector<pid_t>& Ids() {
  static std::vector<pid_t>* ids = new std::vector<pid_t>();
  return *ids;
}

}  // namespace

ComputeThreadScope::ComputeThreadScope() : tid_(gettid()) {
  std::lock_guard<std::mutex> lock(Mutex());
  Ids().push_back(tid_);
}

ComputeThreadScope::~ComputeThreadScope() {
  std::lock_guard<std::mutex> lock(Mutex());
  std::vector<pid_t>& ids = Ids();
  ids.erase(std::find(ids.begin(), ids.end(), tid_));
}

std::thread StartComputeThread(std::function<void()> body) {
  std::promise<void> listed;
  std::future<void> started = listed.get_future();
  std::thread thread([body = std::move(body), listed = std::move(listed)]() mutable {
    const ComputeThreadScope compute;
    listed.set_value();
    body();
  });
  started.wait();
  return thread;
}

std::vector<pid_t> ComputeThreadIds() {
  std::lock_guard<std::mutex> lock(Mutex());
  return Ids();
}

}  // namespace switchserve
