#include "server/http/completion_call.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/runtime/generation_engine.h"
#include "engine/runtime/kv_cache.h"
#include "engine/text/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/call_gate.h"
#include "server/http/render_threads.h"
#include "tests/server/unary_exchange.h"
#include "tests/util/fake_backend.h"

namespace switchserve {
namespace {

constexpr auto kWait = std::chrono::seconds(10);

// A request's final update, and the thread it arrived on (the engine's).
class FinalSink : public GenerationSink {
 public:
  void OnUpdate(GenerationUpdate update) override {
    std::lock_guard<std::mutex> lock(mu_);
    engine_thread_ = std::this_thread::get_id();
    if (update.finished) {
      finished_ = true;
      cv_.notify_all();
    }
  }
  bool WaitFinished() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, [&] { return finished_; });
  }
  std::thread::id engine_thread() {
    std::lock_guard<std::mutex> lock(mu_);
    return engine_thread_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::thread::id engine_thread_;
};

GenerationRequest Prompt(const std::string& text, int max_new_tokens) {
  GenerationRequest request;
  request.prompt.assign(text.begin(), text.end());
  request.sampling.max_new_tokens = max_new_tokens;
  request.sampling.temperature = 0;
  request.sampling.ignore_eos = true;
  request.sampling.logprobs = 2;
  request.sampling.sampled_logprob = true;
  request.stream_interval = 0;
  return request;
}

// A non-streamed completion's JSON (every choice's text and logprobs: for a
// thousand prompts a hundred megabytes) is rendered and answered off the
// engine thread: while the thread that answers is held in Respond, the
// engine finishes another request, and the call still counts in the gate.
TEST(CompletionCallTest, TheEngineStepsOnWhileAUnaryResponseIsAnswered) {
  testing::FakeBackend backend(256, 256);
  auto kv_cache = KvCache::Create(&backend, {.block_size = 4, .max_tokens = 1024});
  ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
  std::unique_ptr<Tokenizer> tokenizer = CreateByteTokenizer();
  EngineOptions engine_options;
  engine_options.scheduler = {256, 16};
  engine_options.context_length = 256;
  GenerationEngine engine(engine_options, &backend, kv_cache->get(), tokenizer.get(), nullptr);
  engine.Start();
  CallGate gate;
  RenderThreads render_threads(1);
  auto exchange = std::make_shared<testing::UnaryExchange>(HttpRequest{}, /*hold=*/true);

  std::vector<GenerationRequest> prompts;
  for (const char* text : {"one", "two", "three"}) prompts.push_back(Prompt(text, 4));
  CompletionCallContext context;
  context.engine = &engine;
  context.tokenizer = tokenizer.get();
  context.gate = &gate;
  context.render_threads = &render_threads;
  context.model_name = "m";
  CompletionOptions options;
  options.logprobs = 2;
  AccessRecord access;
  access.request_id = "r1";
  access.protocol = "http";
  StartCompletionCall(context, exchange, options, std::move(prompts), std::move(access));
  const std::optional<HttpResponse> response = exchange->WaitResponded();
  ASSERT_TRUE(response.has_value()) << "no response";

  // The answering thread is held: the engine runs another request to its end.
  auto neighbour = std::make_shared<FinalSink>();
  GenerationRequest request = Prompt("next", 3);
  request.sink = neighbour;
  ASSERT_TRUE(engine.Submit(std::move(request)).ok());
  const bool neighbour_finished = neighbour->WaitFinished();
  EXPECT_TRUE(neighbour_finished) << "the engine waited for the unary response";
  EXPECT_NE(exchange->responder(), neighbour->engine_thread());
  EXPECT_EQ(gate.calls_in_flight(), 1) << "the call ended before its response was handed over";

  exchange->Release();
  EXPECT_TRUE(gate.WaitUntilIdle(kWait));
  if (!neighbour_finished) neighbour->WaitFinished();

  EXPECT_EQ(response->status, 200);
  const nlohmann::json body = nlohmann::json::parse(response->body);
  ASSERT_EQ(body["choices"].size(), 3u) << response->body;
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["finish_reason"], "length");
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), 4u) << choice;
    EXPECT_EQ(choice["logprobs"]["top_logprobs"][0].size(), 2u) << choice;
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3 + 3 + 5);
  engine.Stop();
}

// Work posted to the render threads runs there, in order, also when posted
// as they stop; after Stop it runs on the caller's thread.
TEST(RenderThreadsTest, RunsEverythingPostedOnItsThreads) {
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  auto record = [&](int i) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(i);
    threads.push_back(std::this_thread::get_id());
  };
  {
    RenderThreads render(1);
    for (int i = 0; i < 100; ++i) render.Post([&record, i] { record(i); });
    render.Stop();
    ASSERT_EQ(order.size(), 100u);
    for (int i = 0; i < 100; ++i) {
      EXPECT_EQ(order[i], i);
      EXPECT_NE(threads[i], std::this_thread::get_id());
    }
    render.Post([&record] { record(100); });
    ASSERT_EQ(order.size(), 101u);
    EXPECT_EQ(threads[100], std::this_thread::get_id());
  }
}

}  // namespace
}  // namespace switchserve
