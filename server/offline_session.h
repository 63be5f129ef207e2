// A model, a backend and a SequenceRunner, set up from the command line's
// --model and --threads: what the offline subcommands (generate, score) run.
#ifndef SWITCHSERVE_SERVER_OFFLINE_SESSION_H_
#define SWITCHSERVE_SERVER_OFFLINE_SESSION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/sequence_runner.h"

namespace switchserve {

struct OfflineSession {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<SequenceRunner> runner;
};

// Loads --model (or the built-in model) and prepares a cache for one sequence
// of the model's full context.
absl::StatusOr<OfflineSession> OpenOfflineSession();

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_OFFLINE_SESSION_H_
