// Flags shared by several subcommands (absl flags are process-global, so each
// is defined exactly once, here).
#ifndef SWITCHSERVE_SERVER_COMMON_FLAGS_H_
#define SWITCHSERVE_SERVER_COMMON_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, threads);

#endif  // SWITCHSERVE_SERVER_COMMON_FLAGS_H_
