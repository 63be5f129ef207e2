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

#include "tests/server/unary_exchange.h"

namespace switchserve {
namespace {

constexpr auto kWait = testing::UnaryExchange::kWait;

HttpRequest Get(std::string target) {
  HttpRequest request;
  request.method = "GET";
  request.target = std::move(target);
  return request;
}

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
  auto exchange = std::make_shared<testing::UnaryExchange>(Get("/metrics"));

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
  auto exchange = std::make_shared<testing::UnaryExchange>(Get("/metrics"));
  service.Handle(exchange);
  EXPECT_TRUE(exchange->responded());
  const std::optional<HttpResponse> response = exchange->WaitResponded();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->status, 404);
  service.Stop();
}

}  // namespace
}  // namespace switchserve
