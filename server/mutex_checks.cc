#include "server/mutex_checks.h"

#include "absl/synchronization/mutex.h"

namespace switchserve {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace switchserve
