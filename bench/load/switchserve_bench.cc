// switchserve-bench: a gRPC load generator for `switchserve serve`.
//
//   switchserve-bench --address HOST:PORT --mode closed --concurrency 16 --requests 500
//   switchserve-bench --address HOST:PORT --mode open --rate 20 --requests 500
//
// Closed loop keeps `concurrency` streaming requests in flight; open loop sends
// requests at Poisson arrival times of mean `rate` per second, whatever the
// server's speed. Every request is a GenerateStream call, so time to first
// token (TTFT) and time per output token (TPOT) are measured at the client.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "bench/load/latency_stats.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "server/flag_spelling.h"
#include "switchserve/v1/generation.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server HOST:PORT");
ABSL_FLAG(std::string, mode, "closed", "closed (fixed concurrency) | open (Poisson arrivals)");
ABSL_FLAG(int, concurrency, 8, "closed loop: requests in flight");
ABSL_FLAG(double, rate, 10, "open loop: mean requests per second");
ABSL_FLAG(int, requests, 200, "requests to send in total");
ABSL_FLAG(std::string, prompt, "The mixture of experts", "prompt text of every request");
ABSL_FLAG(int, max_new_tokens, 32, "tokens to generate per request");
ABSL_FLAG(double, temperature, 0, "sampling temperature (0: greedy)");
ABSL_FLAG(bool, ignore_eos, true, "generate max_new_tokens whatever the model says");
ABSL_FLAG(uint64_t, seed, 1, "seed of the arrival process and of the requests");
ABSL_FLAG(double, timeout_s, 300, "deadline of each request");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the server's certificate; set: use TLS");
ABSL_FLAG(std::string, auth_token_file, "", "file with the bearer token to send");

namespace switchserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "switchserve-bench: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Counts finished requests; Wait blocks until `total` have finished.
class Completion {
 public:
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    cv_.notify_all();
  }
  void Wait(int total) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= total; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
};

struct RunConfig {
  v1::Generation::Stub* stub = nullptr;
  v1::GenerateRequest request;
  std::string token;
  double timeout_s = 300;
  LatencyStats* stats = nullptr;
  Completion* completion = nullptr;
};

// One streaming request (callback API); deletes itself when done and then
// calls `next` (the closed loop starts its successor there).
class StreamCall : public grpc::ClientReadReactor<v1::GenerateStreamResponse> {
 public:
  StreamCall(const RunConfig& config, uint64_t seed, std::function<void()> next)
      : config_(config), next_(std::move(next)) {
    request_ = config.request;
    request_.mutable_sampling()->set_seed(seed);
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(config.timeout_s * 1000)));
    if (!config.token.empty()) context_.AddMetadata("authorization", "Bearer " + config.token);
  }

  void Start() {
    sent_ = Clock::now();
    config_.stub->async()->GenerateStream(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (tokens_ == 0 && message_.token_ids_size() > 0) first_token_ = Clock::now();
    tokens_ += message_.token_ids_size();
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    const Clock::time_point end = Clock::now();
    RequestSample sample;
    sample.ok = status.ok();
    sample.error =
        status.ok() ? "" : std::to_string(status.error_code()) + " " + status.error_message();
    sample.tokens = tokens_;
    sample.latency_ms = MillisSince(sent_, end);
    sample.ttft_ms = tokens_ > 0 ? MillisSince(sent_, first_token_) : sample.latency_ms;
    sample.tpot_ms = tokens_ > 1 ? MillisSince(first_token_, end) / (tokens_ - 1) : 0;
    config_.stats->Add(sample);
    // Start the successor before counting this one done: once the last one is
    // counted, Run() returns and what `next` refers to is gone.
    Completion* completion = config_.completion;
    auto next = std::move(next_);
    delete this;
    if (next) next();
    completion->Done();
  }

 private:
  RunConfig config_;
  std::function<void()> next_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateStreamResponse message_;
  Clock::time_point sent_, first_token_;
  int tokens_ = 0;
};

int Run() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int total = absl::GetFlag(FLAGS_requests);
  if ((mode != "closed" && mode != "open") || total < 1 || absl::GetFlag(FLAGS_concurrency) < 1 ||
      absl::GetFlag(FLAGS_rate) <= 0) {
    std::fprintf(stderr, "switchserve-bench: bad --mode/--requests/--concurrency/--rate\n");
    return 2;
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(ca);
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_address), credentials);
  auto stub = v1::Generation::NewStub(channel);

  LatencyStats stats;
  Completion completion;
  RunConfig config;
  config.stub = stub.get();
  config.request.set_text(absl::GetFlag(FLAGS_prompt));
  config.request.mutable_sampling()->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  config.request.mutable_sampling()->set_temperature(
      static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  config.request.mutable_sampling()->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  if (const std::string file = absl::GetFlag(FLAGS_auth_token_file); !file.empty()) {
    config.token = std::string(absl::StripAsciiWhitespace(ReadFile(file)));
  }
  config.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  config.stats = &stats;
  config.completion = &completion;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);

  const Clock::time_point start = Clock::now();
  std::atomic<int> launched{0};
  // Closed loop: each finished request starts the next until `total` were
  // sent. (Lives until every request is done: the calls refer to it.)
  std::function<void()> launch = [&] {
    const int index = launched.fetch_add(1);
    if (index >= total) return;
    (new StreamCall(config, seed + index, launch))->Start();
  };
  if (mode == "closed") {
    const int initial = std::min(total, absl::GetFlag(FLAGS_concurrency));
    for (int i = 0; i < initial; ++i) launch();
  } else {
    std::mt19937_64 generator(seed);
    std::exponential_distribution<double> gap_s(absl::GetFlag(FLAGS_rate));
    Clock::time_point next = start;
    for (int i = 0; i < total; ++i) {
      std::this_thread::sleep_until(next);
      (new StreamCall(config, seed + i, nullptr))->Start();
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(gap_s(generator)));
    }
  }
  completion.Wait(total);
  const double wall_s = MillisSince(start, Clock::now()) / 1000.0;

  std::printf("switchserve-bench: %s loop, %s, %d requests, prompt %zu bytes, %d new tokens\n",
              mode.c_str(),
              mode == "closed"
                  ? ("concurrency " + std::to_string(absl::GetFlag(FLAGS_concurrency))).c_str()
                  : ("rate " + std::to_string(absl::GetFlag(FLAGS_rate)) + "/s").c_str(),
              total, config.request.text().size(), absl::GetFlag(FLAGS_max_new_tokens));
  std::printf("%s", stats.Report(wall_s).c_str());
  return 0;
}

}  // namespace
}  // namespace switchserve::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "switchserve-bench --address HOST:PORT [--mode closed --concurrency N | --mode open "
      "--rate R] --requests N");
  switchserve::NormalizeFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return switchserve::bench::Run();
}
