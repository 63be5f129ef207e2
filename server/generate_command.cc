// `switchserve generate`: prompt in, text out, offline (no server). Greedy by
// default; --temperature > 0 samples (with --top-k, --top-p, --seed) through the
// same sampler the server uses.
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/runtime/request.h"
#include "engine/runtime/sampler.h"
#include "server/offline_session.h"

ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(int, max_new_tokens, 128, "tokens to generate (stops earlier at EOS)");
ABSL_FLAG(double, temperature, 0.0, "0: greedy; > 0: sample from softmax(logits / temperature)");
ABSL_FLAG(int, top_k, 0, "sample among the k most likely tokens (0: all)");
ABSL_FLAG(double, top_p, 1.0,
          "nucleus sampling: the smallest set of tokens with this much probability");
ABSL_FLAG(uint64_t, seed, 0, "random seed for sampling");

namespace switchserve {

int RunGenerateCommand(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "switchserve generate [--model DIR] --prompt TEXT [--max-new-tokens N] "
      "[--temperature T --top-k K --seed S]");
  absl::ParseCommandLine(argc, argv);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (prompt.empty()) {
    std::fprintf(stderr, "generate: --prompt is required\n");
    return 2;
  }
  absl::StatusOr<OfflineSession> session = OpenOfflineSession();
  if (!session.ok()) {
    std::fprintf(stderr, "generate: %s\n", session.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& config = session->model->config;
  absl::StatusOr<std::vector<int32_t>> encoded = session->model->tokenizer->Encode(prompt);
  if (!encoded.ok()) {
    std::fprintf(stderr, "generate: %s\n", encoded.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> tokens;
  if (config.bos_token_id) tokens.push_back(*config.bos_token_id);
  tokens.insert(tokens.end(), encoded->begin(), encoded->end());

  SamplingParams sampling;
  sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  SamplerRng rng(absl::GetFlag(FLAGS_seed));
  std::vector<int32_t> generated;
  std::string printed;
  std::fputs(prompt.c_str(), stdout);
  std::vector<int32_t> next = tokens;
  for (int step = 0; step < absl::GetFlag(FLAGS_max_new_tokens); ++step) {
    if (session->runner->Length(0) + static_cast<int64_t>(next.size()) > config.max_seq_len) break;
    absl::StatusOr<std::vector<float>> logits =
        session->runner->Append(0, next, /*all_logits=*/false);
    if (!logits.ok()) {
      std::fprintf(stderr, "\ngenerate: %s\n", logits.status().ToString().c_str());
      return 1;
    }
    const int32_t token =
        SampleToken(*logits, sampling, /*history=*/{}, /*num_logprobs=*/0, rng).token_id;
    if (config.eos_token_id && token == *config.eos_token_id) break;
    generated.push_back(token);
    // Print the text decoded so far minus what is already out: SentencePiece
    // pieces only decode correctly in context.
    const std::string text = session->model->tokenizer->Decode(generated);
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
      std::fflush(stdout);
      printed = text;
    }
    next = {token};
  }
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace switchserve
