// The serving threads at a lower priority than the compute threads.
//
// A step runs on the engine thread and the backend's workers
// (engine/runtime/compute_threads.h). Everything else (gRPC's threads, the
// stream writes, the HTTP and metrics servers) wakes for a moment per
// message. On a machine whose cores both share, each of those wake-ups may
// preempt a step, and the step's token then waits for it. A higher nice value
// on the serving threads lets the compute threads keep their cores; the
// serving threads still run, on the cores the step leaves idle or in the
// step's gaps, and messages that wait are merged into fewer writes.
#ifndef SWITCHSERVE_SERVER_THREAD_PRIORITY_H_
#define SWITCHSERVE_SERVER_THREAD_PRIORITY_H_

#include "absl/status/status.h"

namespace switchserve {

// Adds `increment` (1 to 19; the result is at most 19) to the nice value of
// every thread of this process except the compute threads running now,
// the calling thread included. Threads started later inherit the nice value
// of the thread that starts them. Raising a nice value needs no privilege.
absl::Status LowerServingThreadsPriority(int increment);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_THREAD_PRIORITY_H_
