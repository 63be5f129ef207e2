#include "engine/runtime/compute_threads.h"

#include <unistd.h>

#include <algorithm>
#include <mutex>

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

std::vector<pid_t> ComputeThreadIds() {
  std::lock_guard<std::mutex> lock(Mutex());
  return Ids();
}

}  // namespace switchserve
