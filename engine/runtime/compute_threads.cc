#include "engine/runtime/compute_threads.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <utility>

namespace switchserve {
namespace {

// The compute threads running now. Never destroyed: a thread may still end
// (and unlist itself) while the process exits.
struct Registry {
  std::mutex mu;
  std::vector<pid_t> ids;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace

ComputeThreadScope::ComputeThreadScope() : tid_(gettid()) {
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.ids.push_back(tid_);
}

ComputeThreadScope::~ComputeThreadScope() {
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.ids.erase(std::find(registry.ids.begin(), registry.ids.end(), tid_));
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
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  return registry.ids;
}

}  // namespace switchserve
