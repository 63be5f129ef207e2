#include "server/engine_setup.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/backends.h"
#include "server/dispatch_flags.h"

namespace switchserve {
namespace {

// --debug-step-delay-ms: a backend that takes at least `delay` per step.
class SlowedBackend : public Backend {
 public:
  SlowedBackend(std::unique_ptr<Backend> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  std::string_view name() const override { return inner_->name(); }
  std::string_view kernels() const override { return inner_->kernels(); }
  int compute_threads() const override { return inner_->compute_threads(); }
  absl::Status InitKvCache(int64_t num_blocks, int block_size) override {
    return inner_->InitKvCache(num_blocks, block_size);
  }
  DType kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  int64_t KvBytesPerToken() const override { return inner_->KvBytesPerToken(); }
  WeightCopies weight_copies() const override { return inner_->weight_copies(); }
  absl::Status Forward(const StepBatch& batch, StepOutput* out) override {
    std::this_thread::sleep_for(delay_);
    return inner_->Forward(batch, out);
  }

 private:
  std::unique_ptr<Backend> inner_;
  std::chrono::milliseconds delay_;
};

// Waits for a request's final update.
class WaitingSink : public GenerationSink {
 public:
  void OnUpdate(GenerationUpdate update) override {
    if (update.finished) done_.set_value(std::move(update));
  }
  std::future<GenerationUpdate> Future() { return done_.get_future(); }

 private:
  std::promise<GenerationUpdate> done_;
};

}  // namespace

absl::StatusOr<EngineSetup> SetUpEngine(const ServerOptions& options) {
  EngineSetup setup;
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(options.model_dir, options.load);
  if (!model.ok()) return model.status();
  setup.model = *std::move(model);
  const ModelConfig& config = setup.model->config;
  absl::StatusOr<DispatchConfig> dispatch =
      ApplyDispatchOverrides(config.dispatch, options.dispatch);
  if (!dispatch.ok()) return dispatch.status();
  setup.dispatch = *dispatch;

  std::vector<std::string> warnings;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(
      options.device, config, setup.model->weights, setup.dispatch,
      BackendOptions{.num_threads = options.threads,
                     .kv_cache_dtype = options.kv_cache_dtype,
                     .cpu_weight_copies = options.cpu_weight_copies,
                     .cpu_kernels = options.cpu_kernels,
                     // --weights-dtype f32: the CUDA backend's f32 mode too.
                     .cuda_f32_weights = options.load.weights_dtype == WeightsDtype::kF32,
                     .allow_non_finite_weights = options.load.allow_non_finite_weights,
                     .warnings = &warnings});
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("--device ", std::string(ToString(options.device)), ": ",
                                     backend.status().message()));
  }
  setup.model->warnings.insert(setup.model->warnings.end(), warnings.begin(), warnings.end());
  setup.backend = *std::move(backend);
  if (options.debug_step_delay_ms > 0) {
    setup.backend = std::make_unique<SlowedBackend>(
        std::move(setup.backend), std::chrono::milliseconds(options.debug_step_delay_ms));
  }

  KvCacheOptions cache;
  cache.block_size = options.kv_block_size;
  cache.budget_bytes = options.kv_cache_bytes;
  // A full context takes whole blocks: max_seq_len rounded up to the block
  // size (a block of 1024 tokens holds one context of 256, not four).
  const int64_t context_blocks =
      (int64_t{config.max_seq_len} + options.kv_block_size - 1) / options.kv_block_size;
  cache.max_tokens = int64_t{options.max_running_requests} * context_blocks * options.kv_block_size;
  cache.min_tokens = config.max_seq_len;  // one full context
  cache.prefix_caching = options.prefix_caching;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(setup.backend.get(), cache);
  if (!kv_cache.ok()) {
    // A refusal that names its flag already (the CUDA backend's of
    // --kv-block-size) is not about the budget.
    if (kv_cache.status().code() != absl::StatusCode::kInvalidArgument ||
        absl::StartsWith(kv_cache.status().message(), "--")) {
      return kv_cache.status();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-bytes ", options.kv_cache_bytes, ": ", kv_cache.status().message(),
        " (the server keeps room for one full context, max_seq_len ", config.max_seq_len, ")"));
  }
  setup.kv_cache = *std::move(kv_cache);

  EngineOptions& engine = setup.engine_options;
  engine.scheduler.max_batch_tokens = options.max_batch_tokens;
  engine.scheduler.max_running_requests = options.max_running_requests;
  engine.max_queue = options.max_queue;
  engine.context_length = config.max_seq_len;
  engine.eos_token_id = config.eos_token_id;
  engine.dispatch = setup.dispatch;
  return setup;
}

absl::Status WarmUpEngine(GenerationEngine& engine, const ModelConfig& config) {
  auto sink = std::make_shared<WaitingSink>();
  auto future = sink->Future();
  GenerationRequest request;
  request.prompt = {std::min(config.vocab_size - 1, 65)};
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = std::min(2, config.max_seq_len - 1);
  request.sampling.ignore_eos = true;
  request.sink = sink;
  request.observed = false;  // the metrics start from zero
  if (auto id = engine.Submit(std::move(request)); !id.ok()) return id.status();
  GenerationUpdate final = future.get();
  if (!final.status.ok()) {
    return absl::Status(final.status.code(), absl::StrCat("warm-up: ", final.status.message()));
  }
  return absl::OkStatus();
}

}  // namespace switchserve
