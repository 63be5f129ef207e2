// Races between a call's end and what ends it, against the real server: a
// cancellation racing the last token, deadlines of a few milliseconds,
// streams cancelled right after their first message, and SIGTERM during
// traffic. Each call ends with a status its race allows and the engine ends
// idle. Run in the release and ASan builds; not under ThreadSanitizer, which
// cannot follow calls through Debian's uninstrumented gRPC (docs/reliability.md).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"

namespace switchserve::testing {
namespace {

constexpr int kThreads = 6;

// Runs `calls` calls spread over kThreads threads (test_clients.h).
template <typename Call>
std::map<grpc::StatusCode, int> RunConcurrently(int calls, const Call& call) {
  return testing::RunConcurrently<std::mt19937>(kThreads, calls, 1, call);
}

int Total(const std::map<grpc::StatusCode, int>& seen) {
  int total = 0;
  for (const auto& [code, count] : seen) total += count;
  return total;
}

class ConcurrencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = ServerProcess::Start({"--debug-step-delay-ms", "1"});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(*started);
    stub_ = v1::Generation::NewStub(server_->Channel());
  }
  void TearDown() override {
    if (stub_ != nullptr) {
      EXPECT_TRUE(WaitForIdleCache(*stub_));
    }
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(ConcurrencyTest, CancellationRacesTheLastToken) {
  const auto seen = RunConcurrently(120, [&](int, std::mt19937& rng) {
    // About as long as the cancellation delay: either may come first.
    v1::GenerateRequest request = TextRequest("race", 1 + rng() % 4);
    request.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateResponse response;
    std::promise<grpc::Status> done;
    stub_->async()->Generate(&context, &request, &response,
                             [&](grpc::Status status) { done.set_value(std::move(status)); });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
    context.TryCancel();
    return done.get_future().get();
  });
  EXPECT_EQ(Total(seen), 120);
  for (const auto& [code, count] : seen) {
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::CANCELLED) << code;
  }
}

TEST_F(ConcurrencyTest, DeadlinesOfAFewMilliseconds) {
  const auto seen = RunConcurrently(120, [&](int i, std::mt19937& rng) {
    v1::GenerateRequest request = TextRequest("deadline", 2 + rng() % 8);
    request.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(500 + rng() % 5000));
    if (i % 2 == 0) {
      v1::GenerateResponse response;
      return stub_->Generate(&context, request, &response);
    }
    return ReadStream(*stub_, request, &context).status;
  });
  EXPECT_EQ(Total(seen), 120);
  for (const auto& [code, count] : seen) {
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::DEADLINE_EXCEEDED)
        << code;
  }
  EXPECT_GT(seen.count(grpc::StatusCode::DEADLINE_EXCEEDED), 0u);
}

TEST_F(ConcurrencyTest, StreamsCancelledAfterTheFirstMessage) {
  const auto seen = RunConcurrently(60, [&](int, std::mt19937& rng) {
    v1::GenerateRequest request = TextRequest("first", 10 + rng() % 20);
    request.mutable_sampling()->set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub_->GenerateStream(&context, request);
    v1::GenerateStreamResponse message;
    if (reader->Read(&message)) context.TryCancel();
    while (reader->Read(&message)) {
    }
    return reader->Finish();
  });
  EXPECT_EQ(Total(seen), 60);
  for (const auto& [code, count] : seen) {
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::CANCELLED) << code;
  }
  EXPECT_GT(seen.count(grpc::StatusCode::CANCELLED), 0u);
}

// SIGTERM while calls keep arriving: running ones finish or are cut by the
// drain timeout (UNAVAILABLE), new ones are refused (UNAVAILABLE), and the
// process exits 0.
TEST(DrainTest, SigtermDuringTraffic) {
  auto server = ServerProcess::Start({"--debug-step-delay-ms", "2", "--drain-timeout-s", "0.3"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Generation::NewStub((*server)->Channel());
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::mutex mu;
  std::map<grpc::StatusCode, int> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      while (!stop) {
        v1::GenerateRequest request = TextRequest("drain", 5 + rng() % 50);
        request.mutable_sampling()->set_ignore_eos(true);
        auto context = ContextWithDeadline(30);
        grpc::Status status;
        if (rng() % 2 == 0) {
          v1::GenerateResponse response;
          status = stub->Generate(context.get(), request, &response);
        } else {
          status = ReadStream(*stub, request, context.get()).status;
        }
        ++started;
        std::lock_guard<std::mutex> lock(mu);
        ++seen[status.error_code()];
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE) return;  // gone
      }
    });
  }
  while (started < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (*server)->Signal(SIGTERM);
  const int code = (*server)->WaitForExit(60);
  stop = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(code, 0) << (*server)->Log();
  for (const auto& [status, count] : seen) {
    EXPECT_TRUE(status == grpc::StatusCode::OK || status == grpc::StatusCode::UNAVAILABLE)
        << status << " x" << count;
  }
  EXPECT_GT(seen[grpc::StatusCode::UNAVAILABLE], 0);
}

}  // namespace
}  // namespace switchserve::testing
