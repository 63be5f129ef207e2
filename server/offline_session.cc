#include "server/offline_session.h"

#include "absl/flags/flag.h"
#include "kernels/backends.h"
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
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(
      DeviceKind::kCpu, session.model->config, session.model->weights,
      session.model->config.dispatch, BackendOptions{.num_threads = absl::GetFlag(FLAGS_threads)});
  if (!backend.ok()) return backend.status();
  session.backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<SequenceRunner>> runner =
      SequenceRunner::Create(session.backend.get(), session.model->config);
  if (!runner.ok()) return runner.status();
  session.runner = *std::move(runner);
  return session;
}

}  // namespace switchserve
