// `switchserve score`: how well the model predicts a text. Prints the token
// count, the mean negative log-likelihood (nats per predicted token), the
// perplexity and bits per byte; --dump-logits writes the [tokens, vocab]
// logits as .npy for comparison with another implementation.
//
// Texts longer than the context are scored in windows of max_seq_len tokens
// that overlap by one token, so every token but the first is predicted once
// (from at most max_seq_len - 1 tokens of context). Each window is a fresh
// sequence. For a model with routers it also prints the share of routed
// assignments the dispatch dropped and rerouted, per module (attn_v, attn_o,
// ffn), over every window.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/model/npy.h"
#include "engine/moe/router_layout.h"
#include "engine/runtime/sequence_runner.h"
#include "server/auth.h"
#include "server/offline_session.h"

ABSL_FLAG(std::string, text, "", "file whose contents to score");
ABSL_FLAG(std::string, tokens, "", "comma-separated token ids to score instead of --text");
ABSL_FLAG(std::string, dump_logits, "", "write the [tokens, vocab] float32 logits to this .npy");

namespace switchserve {
namespace {

absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: not an integer: \"", part, "\""));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--tokens: no token ids");
  return ids;
}

// -log softmax(logits)[target], in double.
double NegativeLogLikelihood(const float* logits, int32_t vocab, int32_t target) {
  double max_logit = logits[0];
  for (int32_t i = 1; i < vocab; ++i) max_logit = std::max<double>(max_logit, logits[i]);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max_logit);
  return std::log(sum) + max_logit - logits[target];
}

// "dropped_attn_v: 0.020190" ... and "rerouted_...": shares of the routed
// assignments of each module, summed over its routers.
void PrintDispatchShares(const RouterLayout& layout, const StepRoutingStats& stats) {
  if (layout.empty() || stats.routers.size() != layout.size()) return;
  for (MoeModule module : {MoeModule::kAttnV, MoeModule::kAttnO, MoeModule::kFfn}) {
    int64_t routed = 0, dropped = 0, rerouted = 0;
    for (size_t r = 0; r < layout.size(); ++r) {
      if (layout[r].module != module) continue;
      for (int64_t n : stats.routers[r].routed) routed += n;
      for (int64_t n : stats.routers[r].dropped) dropped += n;
      for (int64_t n : stats.routers[r].rerouted) rerouted += n;
    }
    if (routed == 0) continue;
    const std::string name(ToString(module));
    std::printf("dropped_%s: %.6f\nrerouted_%s: %.6f\n", name.c_str(),
                static_cast<double>(dropped) / routed, name.c_str(),
                static_cast<double>(rerouted) / routed);
  }
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "score: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int RunScoreCommand(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string text_path = absl::GetFlag(FLAGS_text);
  const std::string token_list = absl::GetFlag(FLAGS_tokens);
  if (text_path.empty() == token_list.empty()) {
    std::fprintf(stderr, "score: give exactly one of --text FILE and --tokens IDS\n");
    return 2;
  }
  absl::StatusOr<OfflineSession> session = OpenOfflineSession();
  if (!session.ok()) return Fail(session.status());
  const ModelConfig& config = session->model->config;
  const Tokenizer& tokenizer = *session->model->tokenizer;
  if (config.max_seq_len < 2) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("max_seq_len ", config.max_seq_len,
                                                        ": scoring needs a context of 2 or more")));
  }

  std::vector<int32_t> tokens;
  int64_t predicted_bytes = -1;  // unknown for --tokens input
  // The text's bytes that a token predicts: those after the first token's
  // span, unless a BOS precedes it.
  size_t text_bytes = 0;
  size_t unpredicted_bytes = 0;
  if (!token_list.empty()) {
    absl::StatusOr<std::vector<int32_t>> ids = ParseTokenList(token_list);
    if (!ids.ok()) return Fail(ids.status());
    tokens = *std::move(ids);
  } else {
    // A regular file only: a device (/dev/zero) or a FIFO would be read
    // without end, a directory reads as nothing.
    absl::StatusOr<std::string> contents = ReadFileToString(text_path);
    if (!contents.ok()) {
      return Fail(absl::Status(contents.status().code(),
                               absl::StrCat("--text ", contents.status().message())));
    }
    text_bytes = contents->size();
    // The first token's span, not its piece's bytes: a SentencePiece piece
    // also spans the whitespace that normalisation removed before it.
    std::vector<size_t> ends;
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.EncodeSpans(*contents, &ends);
    if (!ids.ok()) return Fail(ids.status());
    if (!config.bos_token_id && !ends.empty()) unpredicted_bytes = ends[0];
    if (config.bos_token_id) tokens.push_back(*config.bos_token_id);
    tokens.insert(tokens.end(), ids->begin(), ids->end());
  }
  if (tokens.size() < 2) {
    const std::string source = token_list.empty() ? absl::StrCat("--text ", text_path) : "--tokens";
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(source, ": need at least 2 tokens, found ", tokens.size())));
  }
  if (token_list.empty()) {
    predicted_bytes = static_cast<int64_t>(text_bytes) - static_cast<int64_t>(unpredicted_bytes);
  }

  const std::string dump_path = absl::GetFlag(FLAGS_dump_logits);
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (!dump_path.empty() && n > config.max_seq_len) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--dump-logits needs at most max_seq_len (",
                                                        config.max_seq_len, ") tokens, got ", n)));
  }
  // A cache for one window: the model's context, or the whole text when shorter.
  SequenceRunnerOptions runner_options;
  runner_options.max_tokens = std::min<int64_t>(n, config.max_seq_len);
  runner_options.block_size = session->kv_block_size;
  absl::StatusOr<std::unique_ptr<SequenceRunner>> runner =
      SequenceRunner::Create(session->backend.get(), config, runner_options);
  if (!runner.ok()) return Fail(runner.status());
  const int32_t vocab = config.vocab_size;
  double nll_sum = 0;
  std::vector<float> all_logits;
  StepRoutingStats routing;
  for (int64_t start = 0; start + 1 < n; start += config.max_seq_len - 1) {
    const int64_t end = std::min<int64_t>(n, start + config.max_seq_len);
    absl::StatusOr<std::vector<float>> logits = (*runner)->Append(
        0, absl::MakeConstSpan(tokens).subspan(start, end - start), /*all_logits=*/true, &routing);
    if (!logits.ok()) return Fail(logits.status());
    (*runner)->Release(0);
    for (int64_t i = start; i + 1 < end; ++i) {
      nll_sum += NegativeLogLikelihood(logits->data() + (i - start) * vocab, vocab, tokens[i + 1]);
    }
    if (!dump_path.empty()) all_logits = *std::move(logits);
    if (end == n) break;
  }
  const int64_t predictions = n - 1;
  const double mean_nll = nll_sum / predictions;
  std::printf("tokens: %lld\npredicted: %lld\nmean_nll: %.6f\nperplexity: %.6f\n",
              static_cast<long long>(n), static_cast<long long>(predictions), mean_nll,
              std::exp(mean_nll));
  if (predicted_bytes > 0) {
    std::printf("bits_per_byte: %.6f\n", nll_sum / std::log(2.0) / predicted_bytes);
  }
  PrintDispatchShares(RouterLayout(config), routing);
  if (!dump_path.empty()) {
    absl::Status status = WriteNpyF32(dump_path, {n, vocab}, all_logits);
    if (!status.ok()) return Fail(status);
    std::printf("logits: %s [%lld, %d]\n", dump_path.c_str(), static_cast<long long>(n), vocab);
  }
  return 0;
}

}  // namespace switchserve
