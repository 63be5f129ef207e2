// The model, backend and engine configuration that `switchserve serve` runs,
// built from ServerOptions in one place, so that everything driving the same
// engine in-process (the load generator's engine-alone mode) gets exactly the
// server's setup: the same KV cache sizing, scheduler limits and dispatch.
#ifndef SWITCHSERVE_SERVER_ENGINE_SETUP_H_
#define SWITCHSERVE_SERVER_ENGINE_SETUP_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/generation_engine.h"
#include "server/server_flags.h"

namespace switchserve {

struct EngineSetup {
  std::unique_ptr<Model> model;
  DispatchConfig dispatch;  // the model's, with the flags' overrides
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvCache> kv_cache;  // the backend's
  EngineOptions engine_options;
};

// Loads options.model_dir (the caller resolves an empty one to the built-in
// model: DefaultModelDirectory() lives in the binary), creates the backend of
// options.device (slowed by options.debug_step_delay_ms when set) and sizes
// its KV cache: the byte budget, but never more than max_running_requests full
// contexts and at least one full context (INVALID_ARGUMENT otherwise).
// FAILED_PRECONDITION for a device this build has no backend for.
absl::StatusOr<EngineSetup> SetUpEngine(const ServerOptions& options);

// One short greedy request through the whole engine (backend, cache,
// sampler); returns its error, if any. The server reports SERVING only after
// it; the load generator uses it to keep first-call costs out of the figures.
// The engine's observer does not see it (GenerationRequest::observed): the
// metrics start from zero.
absl::Status WarmUpEngine(GenerationEngine& engine, const ModelConfig& config);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_ENGINE_SETUP_H_
