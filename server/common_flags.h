// Flags shared by several subcommands (absl flags are process-global, so each
// is defined exactly once, here).
#ifndef SWITCHSERVE_SERVER_COMMON_FLAGS_H_
#define SWITCHSERVE_SERVER_COMMON_FLAGS_H_

#include <chrono>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(bool, allow_non_finite_weights);

namespace switchserve {

// A duration flag given in seconds (validated >= 0 and not NaN; +inf allowed)
// as milliseconds, saturating at kMaxWaitSeconds (about ten years): a
// conversion out of range would otherwise wrap to a negative wait.
inline constexpr double kMaxWaitSeconds = 3.15e8;
std::chrono::milliseconds MillisecondsFromSeconds(double seconds);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_COMMON_FLAGS_H_
