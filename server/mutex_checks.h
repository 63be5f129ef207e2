// Abseil's lock-order checks, off for the programs that serve.
//
// Debian's Abseil is built with its debug checks on. Every absl::Mutex lock
// (gRPC takes several per message) then records the order of the locks held
// in a process-wide graph, under one global lock, and a lock-order inversion
// aborts the process even where it can never deadlock ("dying due to
// potential deadlock"). A server must not die of a report, nor pay for the
// bookkeeping on every message.
#ifndef SWITCHSERVE_SERVER_MUTEX_CHECKS_H_
#define SWITCHSERVE_SERVER_MUTEX_CHECKS_H_

namespace switchserve {

// Call first thing in main, before any thread starts.
void DisableMutexDeadlockDetection();

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_MUTEX_CHECKS_H_
