// A bounded soak of the real server: thousands of mixed unary and streaming
// calls with random sampling parameters and prompt lengths, about 30% of them
// cancelled (by the client, after the first message, or by deadlines of a few
// milliseconds). Afterwards no KV block is used and nothing runs or waits,
// every call ended with a status its kind allows, the server counted each
// call as its client saw it, and the server's memory stayed flat after the
// warm-up.
//
// SWITCHSERVE_SOAK_REQUESTS and SWITCHSERVE_SOAK_CLIENTS scale it (defaults
// 3000 and 12); docs/reliability.md records longer runs.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"

namespace switchserve::testing {
namespace {

constexpr int kContext = 64;  // the test model's max_seq_len

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

// How a call is ended, and which statuses that allows (a call may finish
// before its cancellation or deadline lands).
enum class Ending { kComplete, kClientCancel, kCancelAfterFirstMessage, kShortDeadline };

bool Allowed(Ending ending, grpc::StatusCode code) {
  switch (ending) {
    case Ending::kComplete:
      return code == grpc::StatusCode::OK;
    case Ending::kClientCancel:
    case Ending::kCancelAfterFirstMessage:
      return code == grpc::StatusCode::OK || code == grpc::StatusCode::CANCELLED;
    case Ending::kShortDeadline:
      return code == grpc::StatusCode::OK || code == grpc::StatusCode::DEADLINE_EXCEEDED;
  }
  return false;
}

// A request with random sampling parameters and prompt. `long_running`: it
// cannot end early (no EOS, no stop strings or ids, at least 16 tokens), so a
// cancellation or deadline lands while the server still runs it.
v1::GenerateRequest RandomRequest(std::mt19937_64& rng, bool long_running) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto integer = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  v1::GenerateRequest request;
  const int prompt_len = integer(1, 40);
  if (integer(0, 3) == 0) {
    for (int i = 0; i < prompt_len; ++i) request.mutable_token_ids()->add_ids(integer(0, 255));
  } else {
    std::string text;
    for (int i = 0; i < prompt_len; ++i) text.push_back(static_cast<char>(integer(' ', '~')));
    request.set_text(text);
  }
  v1::SamplingParams& s = *request.mutable_sampling();
  s.set_max_new_tokens(integer(long_running ? 16 : 1, std::min(24, kContext - prompt_len)));
  if (integer(0, 4) == 0) {
    s.set_temperature(0);
  } else {
    s.set_temperature(static_cast<float>(uniform(0.2, 1.5)));
    s.set_top_k(integer(0, 60));
    s.set_top_p(static_cast<float>(uniform(0.3, 1.0)));
    s.set_min_p(static_cast<float>(uniform(0.0, 0.2)));
  }
  if (integer(0, 2) == 0) s.set_repetition_penalty(static_cast<float>(uniform(0.7, 1.4)));
  s.set_seed(rng());
  if (!long_running && integer(0, 5) == 0) {
    s.add_stop(std::string(1, static_cast<char>(integer('a', 'z'))));
  }
  if (!long_running && integer(0, 5) == 0) s.add_stop_token_ids(integer(0, 255));
  s.set_ignore_eos(long_running || integer(0, 1) == 1);
  request.set_logprobs(integer(0, 3));
  request.set_return_routing(integer(0, 7) == 0);
  return request;
}

// One call as the soak makes it; the status the client saw.
grpc::Status RunCall(v1::Generation::Stub& stub, const v1::GenerateRequest& request, bool stream,
                     Ending ending, std::mt19937_64& rng) {
  grpc::ClientContext context;
  const auto now = std::chrono::system_clock::now();
  if (ending == Ending::kShortDeadline) {
    context.set_deadline(now +
                         std::chrono::milliseconds(std::uniform_int_distribution<int>(1, 10)(rng)));
  } else {
    context.set_deadline(now + std::chrono::seconds(120));
  }
  const auto cancel_delay =
      std::chrono::microseconds(std::uniform_int_distribution<int>(0, 8000)(rng));
  if (!stream) {
    v1::GenerateResponse response;
    if (ending != Ending::kClientCancel && ending != Ending::kCancelAfterFirstMessage) {
      return stub.Generate(&context, request, &response);
    }
    std::promise<grpc::Status> done;
    stub.async()->Generate(&context, &request, &response,
                           [&](grpc::Status status) { done.set_value(std::move(status)); });
    std::this_thread::sleep_for(cancel_delay);
    context.TryCancel();
    return done.get_future().get();
  }
  auto reader = stub.GenerateStream(&context, request);
  v1::GenerateStreamResponse message;
  if (ending == Ending::kCancelAfterFirstMessage) {
    if (reader->Read(&message)) context.TryCancel();
  } else if (ending == Ending::kClientCancel) {
    std::this_thread::sleep_for(cancel_delay);
    context.TryCancel();
  }
  while (reader->Read(&message)) {
  }
  return reader->Finish();
}

// switchserve_requests_total of the gRPC calls, by status.
std::map<std::string, double> StatusCounters(int metrics_port) {
  const std::string exposition = HttpGet("127.0.0.1", metrics_port, "/metrics");
  std::map<std::string, double> counters;
  for (const char* name :
       {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED",
        "UNAVAILABLE", "UNAUTHENTICATED", "FAILED_PRECONDITION", "INTERNAL", "UNKNOWN"}) {
    counters[name] = MetricValue(
        exposition,
        absl::StrCat("switchserve_requests_total{protocol=\"grpc\",status=\"", name, "\"}"));
  }
  return counters;
}

// StatusCounters once two reads 100 ms apart agree (within 5 s): a call its
// client saw end may not be counted yet (a cancellation the server has still
// to take up), and each count compared below is of every call.
std::map<std::string, double> SettledStatusCounters(int metrics_port) {
  std::map<std::string, double> last = StatusCounters(metrics_port);
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::map<std::string, double> now = StatusCounters(metrics_port);
    if (now == last) break;
    last = std::move(now);
  }
  return last;
}

TEST(SoakTest, MixedTrafficWithCancellationsLeavesNothingBehind) {
  const int total = EnvInt("SWITCHSERVE_SOAK_REQUESTS", 3000);
  const int clients = EnvInt("SWITCHSERVE_SOAK_CLIENTS", 12);
  const int metrics_port = FreePort("127.0.0.1");
  ASSERT_GT(metrics_port, 0);
  // Under ASan, freed memory waits in a quarantine (256 MB by default) before
  // it is reused, which grows the server's RSS for a reason other than a
  // leak; a 16 MB quarantine fills during the warm-up. Builds without ASan
  // ignore the variable.
  const char* asan_options = std::getenv("ASAN_OPTIONS");
  const std::string quarantine = std::string(asan_options != nullptr ? asan_options : "") +
                                 (asan_options != nullptr ? ":" : "") + "quarantine_size_mb=16";
  setenv("ASAN_OPTIONS", quarantine.c_str(), 1);
  // Small steps and a small cache: chunked prefill and preemption under load.
  // Steps of at least 2 ms, so that a cancelled request (16 tokens or more)
  // is still running when its cancellation or deadline lands.
  auto server = ServerProcess::Start({"--metrics-port", std::to_string(metrics_port),
                                      "--debug-step-delay-ms", "2", "--max-batch-tokens", "96",
                                      "--kv-block-size", "8", "--max-running-requests", "24",
                                      "--kv-cache-bytes", "2097152", "--max-queue", "4096"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  auto stub = v1::Generation::NewStub(channel);

  std::atomic<int> next{0};
  std::atomic<int> finished{0};
  std::mutex mu;
  std::map<grpc::StatusCode, int> seen;  // by status, as the clients saw them
  std::vector<std::string> unexpected;
  const int warm_up = total / 4;
  int64_t rss_after_warm_up = -1;
  std::promise<void> warm;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(1000 + c);
      for (int i = next++; i < total; i = next++) {
        const bool stream = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
        const int roll = std::uniform_int_distribution<int>(0, 99)(rng);
        const Ending ending = roll < 10             ? Ending::kClientCancel
                              : roll < 20           ? Ending::kShortDeadline
                              : roll < 30 && stream ? Ending::kCancelAfterFirstMessage
                              : roll < 30           ? Ending::kClientCancel
                                                    : Ending::kComplete;
        const v1::GenerateRequest request = RandomRequest(rng, ending != Ending::kComplete);
        const grpc::Status status = RunCall(*stub, request, stream, ending, rng);
        std::lock_guard<std::mutex> lock(mu);
        ++seen[status.error_code()];
        if (!Allowed(ending, status.error_code()) && unexpected.size() < 20) {
          unexpected.push_back(absl::StrCat(
              "call ", i, " (", stream ? "stream" : "unary", ", ending ", static_cast<int>(ending),
              "): ", status.error_code(), " ", status.error_message()));
        }
        if (++finished == warm_up) warm.set_value();
      }
    });
  }
  warm.get_future().wait();
  rss_after_warm_up = ResidentKib((*server)->pid());
  for (auto& thread : threads) thread.join();
  const int64_t rss_at_end = ResidentKib((*server)->pid());

  for (const std::string& problem : unexpected) ADD_FAILURE() << problem;
  EXPECT_EQ(finished.load(), total);
  EXPECT_GT(seen[grpc::StatusCode::OK], total / 2);
  EXPECT_GT(seen[grpc::StatusCode::CANCELLED], 0);
  EXPECT_GT(seen[grpc::StatusCode::DEADLINE_EXCEEDED], 0);

  v1::ModelInfo info;
  EXPECT_TRUE(WaitForIdleCache(*stub, &info)) << info.DebugString();
  EXPECT_EQ(info.cache().used_blocks(), 0);
  EXPECT_EQ(info.cache().running_requests(), 0);
  EXPECT_EQ(info.cache().waiting_requests(), 0);

  // The server counts each call once, as its client saw it. A call can race
  // its own end (the response is on the wire when the deadline or the
  // cancellation lands): such a call is OK for the server and not for the
  // client, so the per-status counts may differ by those races only.
  const std::map<std::string, double> counted = SettledStatusCounters(metrics_port);
  double counted_total = 0;
  for (const auto& [name, value] : counted) {
    EXPECT_GE(value, 0) << name << " has no series";
    counted_total += value;
  }
  // A call whose deadline passed before the server saw it is not counted,
  // nor is the server's own warm-up request.
  EXPECT_LE(counted_total, total);
  EXPECT_GE(counted_total, total - seen[grpc::StatusCode::DEADLINE_EXCEEDED]);
  for (const auto& [name, value] : counted) {
    if (name != "OK" && name != "CANCELLED" && name != "DEADLINE_EXCEEDED") {
      EXPECT_EQ(value, 0) << name;
    }
  }
  // Each kind as the clients saw it, up to those races (a few in a thousand
  // here; counting a deadline as CANCELLED, as the server once did, is off by
  // every deadline).
  for (auto [code, name] :
       {std::pair{grpc::StatusCode::OK, "OK"}, std::pair{grpc::StatusCode::CANCELLED, "CANCELLED"},
        std::pair{grpc::StatusCode::DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"}}) {
    EXPECT_NEAR(counted.at(name), seen[code], std::max(10.0, 0.05 * seen[code])) << name;
  }

  // Memory is flat once warm: no per-request leak. (A leak of even a KiB per
  // request would show as megabytes here.)
  std::printf(
      "soak: %d calls (%d OK, %d CANCELLED, %d DEADLINE_EXCEEDED seen by clients; "
      "%.0f, %.0f, %.0f counted by the server), server RSS %lld KiB after %d calls, "
      "%lld KiB at the end\n",
      total, seen[grpc::StatusCode::OK], seen[grpc::StatusCode::CANCELLED],
      seen[grpc::StatusCode::DEADLINE_EXCEEDED], counted.at("OK"), counted.at("CANCELLED"),
      counted.at("DEADLINE_EXCEEDED"), static_cast<long long>(rss_after_warm_up), warm_up,
      static_cast<long long>(rss_at_end));
  ASSERT_GT(rss_after_warm_up, 0);
  EXPECT_LE(rss_at_end - rss_after_warm_up, std::max<int64_t>(4096, rss_after_warm_up / 10));

  // A clean exit; under ASan, LeakSanitizer checks the server's heap here.
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->WaitForExit(60), 0) << (*server)->Log();
}

// Streams whose deadline passes while the server is writing to them. The
// write that finds the client gone and the deadline's cancellation race to
// the server; whichever comes first, the server counts the call as its
// client saw it, DEADLINE_EXCEEDED. Nothing here cancels, so a CANCELLED
// count is a deadline miscounted (once, every write that failed first).
TEST(SoakTest, StreamsPastTheirDeadlineAreCountedAsDeadlines) {
  constexpr int kCalls = 400, kClients = 8;
  const int metrics_port = FreePort("127.0.0.1");
  ASSERT_GT(metrics_port, 0);
  auto server = ServerProcess::Start(
      {"--metrics-port", std::to_string(metrics_port), "--debug-step-delay-ms", "1"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Generation::NewStub((*server)->Channel());

  auto seen =
      RunConcurrently<std::mt19937_64>(kClients, kCalls, 2000, [&](int, std::mt19937_64& rng) {
        grpc::ClientContext context;
        context.set_deadline(
            std::chrono::system_clock::now() +
            std::chrono::milliseconds(std::uniform_int_distribution<int>(3, 30)(rng)));
        auto reader = stub->GenerateStream(&context, RandomRequest(rng, /*long_running=*/true));
        v1::GenerateStreamResponse message;
        while (reader->Read(&message)) {
        }
        return reader->Finish();
      });
  v1::ModelInfo info;
  EXPECT_TRUE(WaitForIdleCache(*stub, &info)) << info.DebugString();

  const std::map<std::string, double> counted = SettledStatusCounters(metrics_port);
  std::printf("%d DEADLINE_EXCEEDED, %d OK seen by clients; %.0f, %.0f counted, %.0f CANCELLED\n",
              seen[grpc::StatusCode::DEADLINE_EXCEEDED], seen[grpc::StatusCode::OK],
              counted.at("DEADLINE_EXCEEDED"), counted.at("OK"), counted.at("CANCELLED"));
  EXPECT_EQ(seen[grpc::StatusCode::DEADLINE_EXCEEDED] + seen[grpc::StatusCode::OK], kCalls);
  EXPECT_GT(seen[grpc::StatusCode::DEADLINE_EXCEEDED], kCalls / 2);
  // CancelCauseOf's 100 ms of slack covers a header the server read that much
  // after its client sent it; a busier machine could read one later still.
  EXPECT_LE(counted.at("CANCELLED"), kCalls / 100);
  EXPECT_LE(counted.at("DEADLINE_EXCEEDED"), seen[grpc::StatusCode::DEADLINE_EXCEEDED]);
  // The race this checks happened often: the server was running at least a
  // quarter of the calls when their deadline passed. (A deadline that passes
  // before the server sees the call is not counted at all: under ASan, 76 of
  // 400 in CI.)
  EXPECT_GT(counted.at("DEADLINE_EXCEEDED"), kCalls / 4);
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->WaitForExit(60), 0) << (*server)->Log();
}

}  // namespace
}  // namespace switchserve::testing
