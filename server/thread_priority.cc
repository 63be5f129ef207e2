#include "server/thread_priority.h"

#include <sys/resource.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/compute_threads.h"

namespace switchserve {

absl::Status LowerServingThreadsPriority(int increment) {
  if (increment < 1 || increment > 19) {
    return absl::InvalidArgumentError(absl::StrCat("nice increment ", increment, " not in 1..19"));
  }
  const std::vector<pid_t> compute = ComputeThreadIds();
  std::set<pid_t> done;
  // A thread may start while the list is read, from a thread not yet
  // lowered: look again until a pass finds no thread it has not seen.
  for (bool found = true; found;) {
    found = false;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", error)) {
      const pid_t tid = static_cast<pid_t>(std::atoi(entry.path().filename().c_str()));
      if (tid <= 0 || done.count(tid) != 0) continue;
      done.insert(tid);
      found = true;
      if (std::find(compute.begin(), compute.end(), tid) != compute.end()) continue;
      // On Linux, PRIO_PROCESS with a thread id sets that thread's nice value.
      errno = 0;
      const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
      if (errno == 0 &&
          setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::min(19, nice + increment)) == 0) {
        continue;
      }
      if (errno == ESRCH) continue;  // the thread has ended
      return absl::ErrnoToStatus(errno, absl::StrCat("setting the nice value of thread ", tid));
    }
    if (error) {
      return absl::InternalError(absl::StrCat("/proc/self/task: ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace switchserve
