#include "server/offline_session.h"

#include "absl/flags/flag.h"
#include "engine/cpu_backend.h"
#include "server/commands.h"
#include "server/common_flags.h"

namespace switchserve {

absl::StatusOr<OfflineSession> OpenOfflineSession() {
  std::string directory = absl::GetFlag(FLAGS_model);
  if (directory.empty()) directory = DefaultModelDirectory();
  OfflineSession session;
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(directory);
  if (!model.ok()) return model.status();
  session.model = *std::move(model);
  CpuBackendOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  session.backend = CreateCpuBackend(session.model->config, session.model->weights,
                                     session.model->config.dispatch, options);
  absl::StatusOr<std::unique_ptr<SequenceRunner>> runner =
      SequenceRunner::Create(session.backend.get(), session.model->config);
  if (!runner.ok()) return runner.status();
  session.runner = *std::move(runner);
  return session;
}

}  // namespace switchserve
