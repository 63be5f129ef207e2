// A fake HttpExchange for a request answered with one Respond (a unary
// response), for the server's unit tests: it records the response and the
// thread that gave it, and can hold that thread until Release().
#ifndef SWITCHSERVE_TESTS_SERVER_UNARY_EXCHANGE_H_
#define SWITCHSERVE_TESTS_SERVER_UNARY_EXCHANGE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "server/http/http_server.h"

namespace switchserve::testing {

class UnaryExchange : public HttpExchange {
 public:
  static constexpr auto kWait = std::chrono::seconds(10);

  // `hold`: Respond holds the thread that calls it until Release(), so that
  // whatever that thread would do next waits meanwhile.
  explicit UnaryExchange(HttpRequest request = {}, bool hold = false)
      : request_(std::move(request)), released_(!hold) {}

  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse response) override {
    std::unique_lock<std::mutex> lock(mu_);
    response_ = std::move(response);
    responder_ = std::this_thread::get_id();
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  void StartStream(HttpResponse) override { ADD_FAILURE() << "a unary call streams"; }
  void Write(std::string) override { ADD_FAILURE() << "a unary call writes"; }
  void WriteRendered(std::function<std::string()>) override { ADD_FAILURE() << "unary"; }
  void WhenWritten(std::function<void()>) override { ADD_FAILURE() << "unary"; }
  void End() override { ADD_FAILURE() << "a unary call ends a stream"; }
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
  std::thread::id responder() {
    std::lock_guard<std::mutex> lock(mu_);
    return responder_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  HttpRequest request_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<HttpResponse> response_;
  std::thread::id responder_;
  bool released_;
};

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_SERVER_UNARY_EXCHANGE_H_
