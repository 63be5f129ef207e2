#include "server/common_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, "", "model directory (default: the built-in model)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | auto");
ABSL_FLAG(int, threads, 0, "CPU threads for the engine (0: all cores)");
