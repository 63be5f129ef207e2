// `switchserve generate`: prompt in, text out, offline (no server). Greedy by
// default; --temperature > 0 samples (with --top-k and --seed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "server/offline_session.h"

ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(int, max_new_tokens, 128, "tokens to generate (stops earlier at EOS)");
ABSL_FLAG(double, temperature, 0.0, "0: greedy; > 0: sample from softmax(logits / temperature)");
ABSL_FLAG(int, top_k, 0, "sample among the k most likely tokens (0: all)");
ABSL_FLAG(uint64_t, seed, 0, "random seed for sampling");

namespace switchserve {
namespace {

int32_t ChooseToken(const std::vector<float>& logits, double temperature, int top_k,
                    std::mt19937_64& rng) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (temperature <= 0.0) return best;
  std::vector<int32_t> order(vocab);
  for (int32_t i = 0; i < vocab; ++i) order[i] = i;
  const int32_t keep = top_k > 0 && top_k < vocab ? top_k : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> weights(keep);
  for (int32_t i = 0; i < keep; ++i) {
    weights[i] = std::exp((logits[order[i]] - logits[best]) / temperature);
  }
  std::discrete_distribution<int32_t> pick(weights.begin(), weights.end());
  return order[pick(rng)];
}

}  // namespace

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

  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
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
        ChooseToken(*logits, absl::GetFlag(FLAGS_temperature), absl::GetFlag(FLAGS_top_k), rng);
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
