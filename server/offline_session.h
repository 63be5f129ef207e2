// A model and a backend, set up from the command line's --model, --device,
// --threads and dispatch overrides (server/dispatch_flags.h): what the
// offline subcommands (generate, score) run on.
#ifndef SWITCHSERVE_SERVER_OFFLINE_SESSION_H_
#define SWITCHSERVE_SERVER_OFFLINE_SESSION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/backend.h"

namespace switchserve {

struct OfflineSession {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;  // its KV cache not yet initialised
  DispatchConfig dispatch;           // the backend's: the model's with the flags' overrides
  int kv_block_size = 16;            // --kv-block-size
};

// Loads --model (or the built-in model) and creates the --device backend
// under the model's dispatch with the flags' overrides.
absl::StatusOr<OfflineSession> OpenOfflineSession();

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_OFFLINE_SESSION_H_
