// Flags shared by several subcommands (absl flags are process-global, so each
// is defined exactly once, here).
#ifndef SWITCHSERVE_SERVER_COMMON_FLAGS_H_
#define SWITCHSERVE_SERVER_COMMON_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "engine/model/model_loader.h"

namespace switchserve {

// --weights-dtype, parsed; INVALID_ARGUMENT names the flag.
absl::StatusOr<ModelLoadOptions> LoadOptionsFromFlags();

}  // namespace switchserve

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, weights_dtype);

#endif  // SWITCHSERVE_SERVER_COMMON_FLAGS_H_
