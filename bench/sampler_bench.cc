// The host sampler (engine/runtime/sampler.h) on one row of random logits,
// per sampled token, with each request field that adds work beside the plain
// draw, at the built-in model's vocabulary (256) and a SentencePiece-sized
// one (32,000):
//   plain        temperature 0.8, top_p 0.95 (greedy: /greedy)
//   bias         300 logit_bias entries
//   bad_words    64 words of 3 ids, two tokenizations each (128 sequences),
//                one of which the generated tokens end in
//   allowed      allowed_token_ids: every other id of the vocabulary, at most
//                1024
//   penalties    repetition, presence and frequency penalties over 2,000
//                tokens of history
// Compare each case with /plain of the same run.
//
// step/vocab:32000/samples:32/{serial,pool}: one CPU backend step of a tiny
// model with that vocabulary, 32 sequences each sampling a token (top-p),
// the samples on the step's thread alone or shared out over its two
// threads (CpuBackendOptions::parallel_sampling_min_vocab).
//
// The allocator's mmap and trim thresholds are raised first, as a running
// server's allocator has raised them: at glibc's starting 128 KiB, a
// sample's 128 KB vectors at 32,000 ids are returned to the system and
// faulted in again each token (about 70 us), or not, depending on which
// cases ran before in the process.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/sampler.h"
#include "tests/util/backend_harness.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

enum class Extra { kPlain, kGreedy, kBias, kBadWords, kAllowed, kPenalties };

void SampleOneToken(benchmark::State& state, Extra extra, int vocab) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(rng);
  SamplingParams params;
  params.temperature = extra == Extra::kGreedy ? 0.0f : 0.8f;
  params.top_p = 0.95f;
  // A prompt of 16 ids, 48 generated (2,000 for the penalties).
  const int history_size = extra == Extra::kPenalties ? 2000 : 64;
  std::vector<int32_t> history(history_size);
  for (int32_t& id : history) id = static_cast<int32_t>(rng() % vocab);
  switch (extra) {
    case Extra::kPlain:
    case Extra::kGreedy:
      break;
    case Extra::kBias:
      for (int i = 0; i < kMaxLogitBias; ++i) {
        params.logit_bias.emplace_back(static_cast<int32_t>(i * vocab / kMaxLogitBias), 1.5f);
      }
      break;
    case Extra::kBadWords:
      for (int w = 0; w < 2 * kMaxBadWords; ++w) {
        params.bad_words_ids.push_back({static_cast<int32_t>(rng() % vocab),
                                        static_cast<int32_t>(rng() % vocab),
                                        static_cast<int32_t>(rng() % vocab)});
      }
      params.bad_words_ids[5] = {history[history_size - 2], history[history_size - 1], 7};
      break;
    case Extra::kAllowed:
      for (int32_t id = 0; id < vocab && id < 2 * 1024; id += 2) {
        params.allowed_token_ids.push_back(id);
      }
      break;
    case Extra::kPenalties:
      params.repetition_penalty = 1.2f;
      params.presence_penalty = 0.5f;
      params.frequency_penalty = 0.3f;
      break;
  }
  SamplerRng draws(3);
  for (auto _ : state) {
    benchmark::DoNotOptimize(SampleToken(logits, params, history, 16, 0, draws));
  }
  state.SetItemsProcessed(state.iterations());
}

void SamplingStep(benchmark::State& state, bool pool) {
  ModelConfig config = testing::TinySwitchAllConfig();
  config.vocab_size = 32000;
  const ModelWeights weights = testing::RandomWeights(config, 5);
  testing::BackendHarness harness(testing::CpuSamplingBackend(pool), config, weights,
                                  config.dispatch);
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_p = 0.95f;
  constexpr int kSequences = 32;
  const std::vector<int32_t> history = testing::RandomTokens(64, config.vocab_size, 9);
  std::vector<SamplerRng> rngs(kSequences, SamplerRng(3));
  std::vector<testing::BackendHarness::Chunk> chunks;
  for (int s = 0; s < kSequences; ++s) {
    testing::BackendHarness::Chunk& chunk = chunks.emplace_back();
    chunk.seq = s;
    chunk.tokens = {history[s]};
    chunk.start = 0;
    chunk.logits = LogitsMode::kNone;
    chunk.sample = {&params, history, &rngs[s], /*prompt_length=*/16};
  }
  StepOutput out;
  for (auto _ : state) {
    if (!harness.Step(chunks, &out).ok()) state.SkipWithError("step failed");
  }
  state.SetItemsProcessed(state.iterations() * kSequences);
}

void RegisterBenchmarks() {
  for (const bool pool : {false, true}) {
    benchmark::RegisterBenchmark(
        pool ? "step/vocab:32000/samples:32/pool" : "step/vocab:32000/samples:32/serial",
        SamplingStep, pool)
        ->Unit(benchmark::kMillisecond);
  }
  const std::pair<const char*, Extra> cases[] = {
      {"plain", Extra::kPlain},     {"greedy", Extra::kGreedy},
      {"bias", Extra::kBias},       {"bad_words", Extra::kBadWords},
      {"allowed", Extra::kAllowed}, {"penalties", Extra::kPenalties}};
  for (const int vocab : {256, 32000}) {
    for (const auto& [name, extra] : cases) {
      const std::string full = std::string("sample/vocab:") + std::to_string(vocab) + "/" + name;
      benchmark::RegisterBenchmark(full.c_str(), SampleOneToken, extra, vocab)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace switchserve

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  switchserve::RegisterBenchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
