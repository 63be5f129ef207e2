// The GenerationEngine tests' common ground (tests/unit/generation_engine*_test.cc):
// a sink that collects a request's updates, an observer that records when a
// request's first token and its end were reported, and a fixture that builds
// an engine over the fake backend (tests/util/fake_backend.h) and submits to
// it. Each test file names the fixture GenerationEngineTest, adding what only
// it needs.
#ifndef SWITCHSERVE_TESTS_UTIL_GENERATION_ENGINE_FIXTURE_H_
#define SWITCHSERVE_TESTS_UTIL_GENERATION_ENGINE_FIXTURE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime/generation_engine.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/util/fake_backend.h"

namespace switchserve::testing {

// Collects a request's updates; Wait() blocks until the final one.
class CollectingSink : public GenerationSink {
 public:
  void OnUpdate(GenerationUpdate update) override;
  const GenerationUpdate& Wait();
  int updates();
  std::string text_;
  std::vector<int32_t> ids_;
  std::vector<int> sizes_;  // tokens in each update, in order

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int updates_ = 0;
  GenerationUpdate final_;
};

// Records when each request's first token and its end were reported.
class FirstTokenRecorder : public EngineObserver {
 public:
  void OnStep(const StepReport&) override {}
  void OnFirstToken(const GenerationRequest&, double queue_seconds,
                    double first_token_seconds) override;
  void OnRequestFinished(const GenerationRequest&, const GenerationUpdate& update) override;
  std::mutex mu;
  std::vector<std::string> events;
  double queue = -1, first_token = -1, total = -1;
};

// Builds an engine over a fresh FakeBackend (256 tokens, 256 positions) and
// submits to it; the engine is the test's to Start() and Stop().
class GenerationEngineFixture : public ::testing::Test {
 protected:
  // An engine with a KV cache of `blocks` blocks of 4 tokens, a step budget
  // of `max_tokens` tokens and `max_running` requests, and `max_queue`
  // requests waiting; not started.
  void Init(int64_t blocks, int64_t max_tokens, int max_running, int max_queue = 1000,
            std::optional<int32_t> eos_token_id = std::nullopt, EngineObserver* observer = nullptr);
  // Submits `prompt` (its bytes, as tokens); last_id_ is its id. A refused
  // request's sink is ended with the refusal (and the test fails).
  std::shared_ptr<CollectingSink> Submit(const std::string& prompt, SamplingParams params,
                                         int stream_interval = 1);
  static SamplingParams Greedy(int n);

  std::unique_ptr<Tokenizer> tokenizer_ = CreateByteTokenizer();
  std::unique_ptr<FakeBackend> backend_;
  std::unique_ptr<KvCache> kv_cache_;
  std::unique_ptr<GenerationEngine> engine_;
  RequestId last_id_ = 0;
};

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_GENERATION_ENGINE_FIXTURE_H_
