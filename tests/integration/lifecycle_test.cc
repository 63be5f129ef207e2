// SIGTERM drain of the real server: readiness goes false, running streams
// complete, new calls get UNAVAILABLE, the process exits 0.
#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"

namespace switchserve::testing {
namespace {

// Starts streams, sends `stop_signal` (SIGTERM) once each has its first
// message, and checks the drain: `drain_timeout_s` is long enough (or
// unbounded) for all to finish. `second_signal` (0: none) is sent while the
// streams drain.
void ExpectSigtermDrainsRunningStreams(const std::string& drain_timeout_s, int second_signal = 0,
                                       int stop_signal = SIGTERM) {
  auto server =
      ServerProcess::Start({"--debug-step-delay-ms", "25", "--drain-timeout-s", drain_timeout_s});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  auto stub = v1::Generation::NewStub(channel);
  constexpr int kStreams = 8;
  constexpr int kTokens = 40;  // about a second at 25 ms per step

  std::atomic<int> started{0};
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request = TextRequest("drain " + std::to_string(i), kTokens);
      request.mutable_sampling()->set_ignore_eos(true);
      auto context = ContextWithDeadline(60);
      auto reader = stub->GenerateStream(context.get(), request);
      v1::GenerateStreamResponse message;
      StreamResult& result = results[i];
      while (reader->Read(&message)) {
        if (result.tokens_per_message.empty()) ++started;
        result.tokens_per_message.push_back(message.token_ids_size());
        result.token_ids.insert(result.token_ids.end(), message.token_ids().begin(),
                                message.token_ids().end());
        result.last = message;
      }
      result.status = reader->Finish();
    });
  }
  while (started.load() < kStreams) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  (*server)->Signal(stop_signal);

  // While the streams drain: not ready, and new calls are refused.
  bool saw_not_serving = false, saw_unavailable = false;
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (int i = 0; i < 100 && !(saw_not_serving && saw_unavailable); ++i) {
    grpc::health::v1::HealthCheckResponse response;
    auto health_context = ContextWithDeadline(5);
    if (health->Check(health_context.get(), {}, &response).ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING) {
      saw_not_serving = true;
    }
    v1::GenerateResponse generated;
    auto context = ContextWithDeadline(5);
    if (stub->Generate(context.get(), TextRequest("late", 2), &generated).error_code() ==
        grpc::StatusCode::UNAVAILABLE) {
      saw_unavailable = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(saw_not_serving);
  EXPECT_TRUE(saw_unavailable);
  if (second_signal != 0) (*server)->Signal(second_signal);

  for (auto& thread : threads) thread.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].token_ids.size(), static_cast<size_t>(kTokens)) << i;
    EXPECT_TRUE(results[i].last.finished()) << i;
  }
  EXPECT_EQ((*server)->WaitForExit(30), 0) << (*server)->Log();
}

TEST(LifecycleTest, SigtermDrainsRunningStreamsAndExitsZero) {
  ExpectSigtermDrainsRunningStreams("30");
}

// A second SIGTERM or a SIGINT while the streams drain changes nothing. The
// kernel gave it to a thread OpenBLAS had started before the signals were
// blocked, whose default action ended the process mid-drain.
TEST(LifecycleTest, ASecondSignalDuringTheDrainChangesNothing) {
  ExpectSigtermDrainsRunningStreams("30", SIGTERM);
  ExpectSigtermDrainsRunningStreams("30", SIGINT);
}

// SIGINT (Ctrl-C) and SIGHUP (the terminal that started the server closed)
// drain as SIGTERM does; SIGHUP's default action ended the process at once,
// cutting off every running call.
TEST(LifecycleTest, SigintAndSighupDrainLikeSigterm) {
  ExpectSigtermDrainsRunningStreams("30", 0, SIGINT);
  ExpectSigtermDrainsRunningStreams("30", 0, SIGHUP);
}

// An unbounded grace period waits for the calls; it used to overflow in the
// conversion to milliseconds and cancel every call at once.
TEST(LifecycleTest, InfiniteDrainTimeoutLetsRunningStreamsFinish) {
  ExpectSigtermDrainsRunningStreams("inf");
  ExpectSigtermDrainsRunningStreams("1e300");
}

// With nothing running, SIGTERM ends the process at once, also while a
// client keeps its connection open (shutdown used to wait a fixed 2 s for
// such connections). The bound is far above the few milliseconds it takes.
TEST(LifecycleTest, IdleConnectionsDoNotDelayTheExit) {
  auto server = ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  auto stub = v1::Generation::NewStub(channel);
  v1::GenerateResponse response;
  auto context = ContextWithDeadline(30);
  ASSERT_TRUE(stub->Generate(context.get(), TextRequest("hi", 2), &response).ok());
  const auto start = std::chrono::steady_clock::now();
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->WaitForExit(30), 0) << (*server)->Log();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.5);
}

// The names `top -H`, `ps -T` and perf show for a process's threads.
std::multiset<std::string> ThreadNames(pid_t pid) {
  std::multiset<std::string> names;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  return names;
}

// The server's own threads carry names, so that an operator can tell the
// engine's CPU from the serving path's (bench/serving_overhead.py adds them up).
TEST(LifecycleTest, ServerThreadsAreNamed) {
  auto server = ServerProcess::Start({"--threads", "3"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Generation::NewStub((*server)->Channel());
  auto context = ContextWithDeadline(30);
  auto reader = stub->GenerateStream(context.get(), TextRequest("hi", 2));
  v1::GenerateStreamResponse message;
  while (reader->Read(&message)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  const std::multiset<std::string> names = ThreadNames((*server)->pid());
  EXPECT_EQ(names.count("engine"), 1u);
  EXPECT_EQ(names.count("cpu-worker-1"), 1u);
  EXPECT_EQ(names.count("cpu-worker-2"), 1u);
  EXPECT_EQ(names.count("stream-writes"), 1u);
}

// The startup log says how much host memory the CPU backend's weight copies
// take, or that --cpu-weight-copies=false turned them off.
TEST(LifecycleTest, StartupLogReportsTheWeightCopies) {
  for (bool on : {true, false}) {
    auto server = ServerProcess::Start(on ? std::vector<std::string>{}
                                          : std::vector<std::string>{"--cpu-weight-copies=false"});
    ASSERT_TRUE(server.ok()) << server.status();
    const std::string log = (*server)->Log();
    const std::string line = "weight copies for batch-1 decode: ";
    const size_t at = log.find(line);
    ASSERT_NE(at, std::string::npos) << log;
    const std::string said = log.substr(at + line.size(), log.find('\n', at) - at - line.size());
    if (on) {
      EXPECT_TRUE(said.find(" MiB of host memory") != std::string::npos &&
                  std::isdigit(static_cast<unsigned char>(said[0])))
          << said;
    } else {
      EXPECT_EQ(said, "off (--cpu-weight-copies=false)");
    }
  }
}

// The startup log names the build of the CPU kernels: the fastest this CPU
// runs by default, the one --cpu-kernels names otherwise.
TEST(LifecycleTest, StartupLogNamesTheKernelBuild) {
  for (const std::string& kernels : {std::string(), std::string("generic")}) {
    auto server =
        ServerProcess::Start(kernels.empty() ? std::vector<std::string>{}
                                             : std::vector<std::string>{"--cpu-kernels", kernels});
    ASSERT_TRUE(server.ok()) << server.status();
    const std::string log = (*server)->Log();
    if (kernels.empty()) {
      EXPECT_TRUE(log.find("backend cpu (avx512 kernels),") != std::string::npos ||
                  log.find("backend cpu (avx2 kernels),") != std::string::npos ||
                  log.find("backend cpu (generic kernels),") != std::string::npos)
          << log;
    } else {
      EXPECT_NE(log.find("backend cpu (generic kernels),"), std::string::npos) << log;
    }
  }
}

// The startup log counts the threads a step runs on: with --threads 0, the
// CPUs available and no more than OpenMP's OMP_NUM_THREADS allows.
TEST(LifecycleTest, StartupLogCountsTheThreadsTheBackendRuns) {
  ASSERT_EQ(setenv("OMP_NUM_THREADS", "1", 1), 0);
  auto server = ServerProcess::Start({"--threads", "0"});
  unsetenv("OMP_NUM_THREADS");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string log = (*server)->Log();
  EXPECT_TRUE(log.find(", threads 1 (OMP_NUM_THREADS), serving") != std::string::npos ||
              log.find(", threads 1 (all CPUs), serving") != std::string::npos)
      << log;
  // The same through the test flag that wraps the backend to slow its steps.
  auto slowed = ServerProcess::Start({"--threads", "1", "--debug-step-delay-ms", "1"});
  ASSERT_TRUE(slowed.ok()) << slowed.status();
  EXPECT_NE((*slowed)->Log().find(", threads 1, serving"), std::string::npos) << (*slowed)->Log();
}

}  // namespace
}  // namespace switchserve::testing
