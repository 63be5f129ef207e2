// The OpenAI service's GET /metrics: the scrape is rendered on a render
// thread, not on the thread that hands the request in (a connection's I/O
// thread, which meanwhile writes other responses' streams).
#include "server/http/openai_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace switchserve {
namespace {

constexpr auto kWait = std::chrono::seconds(10);

// An exchange for one GET whose Respond records the response.
class RecordingExchange : public HttpExchange {
 public:
  explicit RecordingExchange(std::string target) {
    request_.method = "GET";
    request_.target = std::move(target);
  }
  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    response_ = std::move(response);
    cv_.notify_all();
  }
  void StartStream(HttpResponse) override { ADD_FAILURE() << "a GET streams"; }
  void Write(std::string) override { ADD_FAILURE() << "a GET writes"; }
  void WriteRendered(std::function<std::string()>) override { ADD_FAILURE() << "a GET writes"; }
  void WhenWritten(std::function<void()>) override { ADD_FAILURE() << "a GET waits"; }
  void End() override { ADD_FAILURE() << "a GET ends a stream"; }
  void OnClientGone(std::function<void(const absl::Status&)>) override {}

  bool responded() {
    std::lock_guard<std::mutex> lock(mu_);
    return response_.has_value();
  }
  // The response (moved out: call once), once Respond was called (within
  // kWait), else nullopt.
  std::optional<HttpResponse> WaitResponded() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kWait, [&] { return response_.has_value(); })) return std::nullopt;
    return std::move(response_);
  }

 private:
  HttpRequest request_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<HttpResponse> response_;
};

// A metrics text that holds the thread rendering it until Release() (or
// kWait), and says which thread that was.
class HeldMetrics {
 public:
  std::string Render() {
    std::unique_lock<std::mutex> lock(mu_);
    renderer_ = std::this_thread::get_id();
    cv_.notify_all();
    cv_.wait_for(lock, kWait, [&] { return released_; });
    return "switchserve_up 1\n";
  }
  // The thread that began rendering (within kWait), else nullopt.
  std::optional<std::thread::id> WaitRenderer() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kWait, [&] { return renderer_.has_value(); })) return std::nullopt;
    return renderer_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::thread::id> renderer_;
  bool released_ = false;
};

TEST(OpenAiServiceTest, MetricsAreRenderedOffTheThreadThatHandsTheRequestIn) {
  HeldMetrics metrics;
  OpenAiServiceOptions options;
  options.model_name = "test";
  options.metrics_text = [&] { return metrics.Render(); };
  OpenAiService service(options);
  auto exchange = std::make_shared<RecordingExchange>("/metrics");

  service.Handle(exchange);  // returns with the rendering held
  const std::optional<std::thread::id> renderer = metrics.WaitRenderer();
  ASSERT_TRUE(renderer.has_value()) << "the metrics were never rendered";
  EXPECT_NE(*renderer, std::this_thread::get_id());
  EXPECT_FALSE(exchange->responded());

  metrics.Release();
  const std::optional<HttpResponse> response = exchange->WaitResponded();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response->body, "switchserve_up 1\n");
  service.Stop();
}

// Metrics off (--metrics-port 0): 404 at once, on the calling thread.
TEST(OpenAiServiceTest, MetricsOffAnswerNotFound) {
  OpenAiServiceOptions options;
  options.model_name = "test";
  OpenAiService service(options);
  auto exchange = std::make_shared<RecordingExchange>("/metrics");
  service.Handle(exchange);
  EXPECT_TRUE(exchange->responded());
  const std::optional<HttpResponse> response = exchange->WaitResponded();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 404);
  service.Stop();
}

}  // namespace
}  // namespace switchserve
