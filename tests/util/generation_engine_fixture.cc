#include "tests/util/generation_engine_fixture.h"

#include <utility>

namespace switchserve::testing {

void CollectingSink::OnUpdate(GenerationUpdate update) {
  std::lock_guard<std::mutex> lock(mu_);
  text_ += update.text;
  for (const auto& t : update.tokens) ids_.push_back(t.token_id);
  sizes_.push_back(static_cast<int>(update.tokens.size()));
  ++updates_;
  if (update.finished) {
    final_ = std::move(update);
    done_ = true;
    cv_.notify_all();
  }
}

const GenerationUpdate& CollectingSink::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return final_;
}

int CollectingSink::updates() {
  std::lock_guard<std::mutex> lock(mu_);
  return updates_;
}

void FirstTokenRecorder::OnFirstToken(const GenerationRequest&, double queue_seconds,
                                      double first_token_seconds) {
  std::lock_guard<std::mutex> lock(mu);
  events.push_back("first token");
  queue = queue_seconds;
  first_token = first_token_seconds;
}

void FirstTokenRecorder::OnRequestFinished(const GenerationRequest&,
                                           const GenerationUpdate& update) {
  std::lock_guard<std::mutex> lock(mu);
  events.push_back("finished");
  total = update.total_ms / 1e3;
}

void GenerationEngineFixture::Init(int64_t blocks, int64_t max_tokens, int max_running,
                                   int max_queue, std::optional<int32_t> eos_token_id,
                                   EngineObserver* observer) {
  backend_ = std::make_unique<FakeBackend>(256, 256);
  KvCacheOptions cache;
  cache.block_size = 4;
  cache.max_tokens = blocks * 4;
  auto kv_cache = KvCache::Create(backend_.get(), cache);
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  kv_cache_ = *std::move(kv_cache);
  ASSERT_EQ(kv_cache_->num_blocks(), blocks);
  EngineOptions options;
  options.scheduler = {max_tokens, max_running};
  options.max_queue = max_queue;
  options.context_length = 256;
  options.eos_token_id = eos_token_id;
  engine_ = std::make_unique<GenerationEngine>(options, backend_.get(), kv_cache_.get(),
                                               tokenizer_.get(), observer);
}

std::shared_ptr<CollectingSink> GenerationEngineFixture::Submit(const std::string& prompt,
                                                                SamplingParams params,
                                                                int stream_interval) {
  auto sink = std::make_shared<CollectingSink>();
  GenerationRequest request;
  request.prompt.assign(prompt.begin(), prompt.end());
  request.sampling = params;
  request.stream_interval = stream_interval;
  request.sink = sink;
  auto id = engine_->Submit(std::move(request));
  EXPECT_TRUE(id.ok()) << id.status();
  last_id_ = id.ok() ? *id : 0;
  if (!id.ok()) {
    // The engine sends a refused request nothing: end its sink here, with
    // the refusal, so that waiting on it fails the test instead of hanging.
    GenerationUpdate refused;
    refused.finished = true;
    refused.status = id.status();
    sink->OnUpdate(std::move(refused));
  }
  return sink;
}

SamplingParams GenerationEngineFixture::Greedy(int n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = n;
  return p;
}

}  // namespace switchserve::testing
