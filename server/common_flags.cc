#include "server/common_flags.h"

#include <algorithm>
#include <cstdint>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, "", "model directory (default: the built-in model)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | auto");
ABSL_FLAG(int, threads, 0, "CPU threads for the engine (0: all cores)");
ABSL_FLAG(bool, allow_non_finite_weights, false,
          "Load weights holding NaN or infinity (with a warning) instead of refusing the model");

namespace switchserve {

std::chrono::milliseconds MillisecondsFromSeconds(double seconds) {
  // NaN compares false: it becomes 0, like a negative value.
  const double clamped = seconds > 0 ? std::min(seconds, kMaxWaitSeconds) : 0.0;
  return std::chrono::milliseconds(static_cast<int64_t>(clamped * 1000.0));
}

}  // namespace switchserve
