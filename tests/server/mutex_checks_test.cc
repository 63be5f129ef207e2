// The lock-order checks Debian's Abseil runs by default, and the switch that
// turns them off in switchserve's programs (server/mutex_checks.h).
#include "server/mutex_checks.h"

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"

namespace switchserve {
namespace {

// Takes two locks in one order, then in the other: a lock-order inversion,
// though one thread alone can never deadlock on it.
void InvertLockOrder() {
  absl::Mutex a, b;
  a.Lock();
  b.Lock();
  b.Unlock();
  a.Unlock();
  b.Lock();
  a.Lock();
  a.Unlock();
  b.Unlock();
}

// Why the switch exists: in a fresh process (the death test's own), the
// inversion kills it.
TEST(MutexChecksDeathTest, LockOrderInversionAbortsByDefault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(InvertLockOrder(), "potential deadlock");
}

TEST(MutexChecks, LockOrderInversionDoesNotAbortOnceDisabled) {
  DisableMutexDeadlockDetection();
  InvertLockOrder();  // returns: the process is alive
  SUCCEED();
}

}  // namespace
}  // namespace switchserve
