// `switchserve generate`: prompt in, text out, offline (no server). The prompt
// runs through a GenerationEngine exactly as a server request does (the same
// scheduler, backend sampling, EOS handling and incremental detokenizer), one
// request at a time; the text is printed as it is released. Greedy by
// default; --temperature > 0 samples (with --top-k, --top-p, --seed).
#include <algorithm>
#include <cstdio>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/runtime/generation_engine.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/request.h"
#include "server/offline_session.h"
#include "server/request_validation.h"

ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(int, max_new_tokens, 128, "tokens to generate (stops earlier at EOS)");
ABSL_FLAG(double, temperature, 0.0, "0: greedy; > 0: sample from softmax(logits / temperature)");
ABSL_FLAG(int, top_k, 0, "sample among the k most likely tokens (0: all)");
ABSL_FLAG(double, top_p, 1.0,
          "nucleus sampling: the smallest set of tokens with this much probability");
ABSL_FLAG(double, min_p, 0.0, "drop tokens below min_p x the top probability (0: off)");
ABSL_FLAG(double, repetition_penalty, 1.0,
          "divide positive (multiply negative) logits of tokens already in the text (1: off)");
ABSL_FLAG(double, presence_penalty, 0.0,
          "subtracted from the logit of each token already generated, once (0: off)");
ABSL_FLAG(double, frequency_penalty, 0.0,
          "subtracted from the logit of each token already generated, per time it was (0: off)");
ABSL_FLAG(uint64_t, seed, 0, "random seed for sampling");

namespace switchserve {
namespace {

// The prompt's chunk size: what generate has always used.
constexpr int64_t kPrefillChunk = 512;

// Prints the request's text as the engine releases it; Wait() returns the
// final update.
class PrintingSink : public GenerationSink {
 public:
  void OnUpdate(GenerationUpdate update) override {
    if (!update.text.empty()) {
      std::fwrite(update.text.data(), 1, update.text.size(), stdout);
      std::fflush(stdout);
    }
    if (update.finished) done_.set_value(std::move(update));
  }
  GenerationUpdate Wait() { return done_.get_future().get(); }

 private:
  std::promise<GenerationUpdate> done_;
};

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (prompt.empty()) {
    std::fprintf(stderr, "generate: --prompt is required\n");
    return 2;
  }
  // The server's ranges, checked in double before narrowing to float, as the
  // HTTP API checks its numbers (server/request_validation.h).
  const double temperature = absl::GetFlag(FLAGS_temperature);
  const double top_p = absl::GetFlag(FLAGS_top_p);
  const double min_p = absl::GetFlag(FLAGS_min_p);
  const double repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  const double presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  const double frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  for (const auto& [field, name, value] :
       {std::tuple{SamplingFloat::kTemperature, "--temperature", temperature},
        std::tuple{SamplingFloat::kTopP, "--top-p", top_p},
        std::tuple{SamplingFloat::kMinP, "--min-p", min_p},
        std::tuple{SamplingFloat::kRepetitionPenalty, "--repetition-penalty", repetition_penalty},
        std::tuple{SamplingFloat::kPresencePenalty, "--presence-penalty", presence_penalty},
        std::tuple{SamplingFloat::kFrequencyPenalty, "--frequency-penalty", frequency_penalty}}) {
    if (absl::Status status = CheckSamplingFloat(field, name, value); !status.ok()) {
      std::fprintf(stderr, "generate: %s\n", std::string(status.message()).c_str());
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_top_k) < 0) {
    std::fprintf(stderr, "generate: --top-k must be >= 0 (0: off)\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_new_tokens) < 0) {
    std::fprintf(stderr, "generate: --max-new-tokens must be >= 0\n");
    return 2;
  }
  absl::StatusOr<OfflineSession> session = OpenOfflineSession();
  if (!session.ok()) {
    std::fprintf(stderr, "generate: %s\n", session.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& config = session->model->config;
  const Tokenizer& tokenizer = *session->model->tokenizer;
  absl::StatusOr<std::vector<int32_t>> encoded = tokenizer.Encode(prompt);
  if (!encoded.ok()) {
    std::fprintf(stderr, "generate: %s\n", encoded.status().ToString().c_str());
    return 1;
  }
  GenerationRequest request;
  if (config.bos_token_id) request.prompt.push_back(*config.bos_token_id);
  request.prompt.insert(request.prompt.end(), encoded->begin(), encoded->end());
  SamplingParams& sampling = request.sampling;
  sampling.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.seed = absl::GetFlag(FLAGS_seed);
  sampling.temperature = NarrowSamplingFloat(temperature);
  sampling.top_p = NarrowSamplingFloat(top_p);
  sampling.min_p = NarrowSamplingFloat(min_p);
  sampling.repetition_penalty = NarrowSamplingFloat(repetition_penalty);
  sampling.presence_penalty = NarrowSamplingFloat(presence_penalty);
  sampling.frequency_penalty = NarrowSamplingFloat(frequency_penalty);

  // The server refuses what does not fit its context; the command generates
  // what fits (the token predicted from the context's last position too) and
  // says so, and refuses a prompt that leaves nothing to generate.
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (prompt_tokens > config.max_seq_len) {
    std::fprintf(stderr, "generate: --prompt is %lld tokens, more than the context (%d)\n",
                 static_cast<long long>(prompt_tokens), config.max_seq_len);
    return 1;
  }
  const int64_t room = int64_t{config.max_seq_len} + 1 - prompt_tokens;
  if (sampling.max_new_tokens > room) {
    std::fprintf(stderr,
                 "generate: the context (%d tokens) leaves room for %lld of the %d new tokens "
                 "--max-new-tokens asks after the %lld-token prompt\n",
                 config.max_seq_len, static_cast<long long>(room), sampling.max_new_tokens,
                 static_cast<long long>(prompt_tokens));
  }
  std::fputs(prompt.c_str(), stdout);
  if (sampling.max_new_tokens > 0) {
    // The cache holds what this request can reach, not a whole context: a
    // model's max_seq_len alone must not size an allocation.
    KvCacheOptions cache;
    cache.block_size = session->kv_block_size;
    cache.max_tokens = std::min<int64_t>(
        config.max_seq_len, static_cast<int64_t>(request.prompt.size()) + sampling.max_new_tokens);
    absl::StatusOr<std::unique_ptr<KvCache>> kv_cache =
        KvCache::Create(session->backend.get(), cache);
    if (!kv_cache.ok()) {
      std::fprintf(stderr, "\ngenerate: %s\n", kv_cache.status().ToString().c_str());
      return 1;
    }
    EngineOptions options;
    options.scheduler.max_batch_tokens = kPrefillChunk;
    options.scheduler.max_running_requests = 1;
    options.max_queue = 1;
    // The token predicted from the last position of the context is still
    // generated (it is never fed back), so a sequence may end one token past
    // max_seq_len (saturating: max_seq_len may be the largest int).
    options.context_length = config.max_seq_len < std::numeric_limits<int>::max()
                                 ? config.max_seq_len + 1
                                 : config.max_seq_len;
    options.eos_token_id = config.eos_token_id;
    GenerationEngine engine(options, session->backend.get(), kv_cache->get(), &tokenizer,
                            /*observer=*/nullptr);
    auto sink = std::make_shared<PrintingSink>();
    request.sink = sink;
    engine.Start();
    if (absl::StatusOr<RequestId> id = engine.Submit(std::move(request)); !id.ok()) {
      std::fprintf(stderr, "\ngenerate: %s\n", id.status().ToString().c_str());
      return 1;
    }
    const GenerationUpdate final_update = sink->Wait();
    engine.Stop();
    if (!final_update.status.ok()) {
      std::fprintf(stderr, "\ngenerate: %s\n", final_update.status.ToString().c_str());
      return 1;
    }
  }
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace switchserve
