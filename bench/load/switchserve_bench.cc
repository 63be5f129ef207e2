// switchserve-bench: a load generator for switchserve, over gRPC or straight
// into the engine.
//
//   switchserve-bench --address HOST:PORT --mode closed --concurrency 16 --requests 500
//   switchserve-bench --address HOST:PORT --mode open --rate 20 --requests 500
//   switchserve-bench --http-address IP:PORT --concurrency 16 --requests 500
//   switchserve-bench --engine-model DIR --threads 2 --concurrency 16 --requests 500
//
// Closed loop keeps `concurrency` streaming requests in flight; open loop sends
// requests at Poisson arrival times of mean `rate` per second, whatever the
// server's speed. Over gRPC every request is a GenerateStream call, so time to
// first token (TTFT) and time per output token (TPOT) are measured at the
// client. With --engine-model the same load goes through an in-process
// GenerationEngine built exactly as `switchserve serve` builds it (the serve
// flags --threads, --max-batch-tokens, --max-running-requests,
// --kv-cache-bytes, --stream-interval, ... apply, with the same defaults):
// the gRPC figures divided by these are the cost of serving.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/load/engine_transport.h"
#include "bench/load/grpc_transport.h"
#include "bench/load/http_transport.h"
#include "bench/load/load_generator.h"
#include "engine/runtime/generation_engine.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kernels/backends.h"
#include "server/common_flags.h"
#include "server/engine_setup.h"
#include "server/flag_spelling.h"
#include "server/mutex_checks.h"
#include "server/request_validation.h"
#include "server/server_flags.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "server HOST:PORT");
ABSL_FLAG(std::string, http_address, "",
          "IP:PORT of the server's HTTP API: send streaming /v1/completions instead of gRPC "
          "(with stream_options.include_usage: each request's usage gives its token count)");
ABSL_FLAG(std::string, engine_model, "",
          "model directory: run the load through an in-process engine instead of gRPC");
ABSL_FLAG(std::string, mode, "closed", "closed (fixed concurrency) | open (Poisson arrivals)");
ABSL_FLAG(int, concurrency, 8, "closed loop: requests in flight");
ABSL_FLAG(double, rate, 10, "open loop: mean requests per second");
ABSL_FLAG(int, requests, 200, "requests to send in total");
ABSL_FLAG(int, warmup_requests, 0,
          "requests sent first (closed loop) and left out of every figure: the connection "
          "and the threads are up before the timed load");
ABSL_FLAG(std::string, prompt, "The mixture of experts", "prompt text of every request");
ABSL_FLAG(std::string, prompt_ids, "",
          "comma-separated prompt token ids of every request (instead of --prompt)");
ABSL_FLAG(int, priority, 0,
          "every request's scheduling priority (lower first; a server started with "
          "--scheduling-policy priority takes anything but 0)");
ABSL_FLAG(int, distinct_tail_tokens, 0,
          "with --prompt-ids: each request's last N prompt ids are its own (drawn from its "
          "seed), the rest shared by all, as behind one system prompt; 0: the same prompt");
ABSL_FLAG(int, max_new_tokens, 32, "tokens to generate per request");
ABSL_FLAG(double, temperature, 0, "sampling temperature (0: greedy)");
ABSL_FLAG(bool, ignore_eos, true, "generate max_new_tokens whatever the model says");
ABSL_FLAG(uint64_t, seed, 1, "seed of the arrival process and of the requests");
ABSL_FLAG(double, timeout_s, 300, "deadline of each request");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA of the server's certificate; set: use TLS");
// --auth-token-file is the serve flag's (server/server_flags.cc, linked in for
// the engine setup); here: the file with the bearer token to send.
ABSL_DECLARE_FLAG(std::string, auth_token_file);

namespace switchserve::bench {
namespace {

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

int Usage(const std::string& problem) {
  std::fprintf(stderr, "switchserve-bench: %s\n", problem.c_str());
  return 2;
}

// The request every client sends (sampling.seed is set per request).
absl::StatusOr<v1::GenerateRequest> RequestFromFlags() {
  v1::GenerateRequest request;
  if (const std::string ids = absl::GetFlag(FLAGS_prompt_ids); !ids.empty()) {
    for (absl::string_view piece : absl::StrSplit(ids, ',', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(piece, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompt-ids: not a token id: \"", piece, "\""));
      }
      request.mutable_token_ids()->add_ids(id);
    }
  } else {
    request.set_text(absl::GetFlag(FLAGS_prompt));
  }
  v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  sampling->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  sampling->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  request.set_priority(absl::GetFlag(FLAGS_priority));
  return request;
}

std::string BearerToken() {
  const std::string file = absl::GetFlag(FLAGS_auth_token_file);
  return file.empty() ? "" : std::string(absl::StripAsciiWhitespace(ReadFile(file)));
}

int RunOverGrpc(const v1::GenerateRequest& request, const LoadOptions& load,
                std::string* transport_name) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(ca);
    credentials = grpc::SslCredentials(ssl);
  }
  const std::string address = absl::GetFlag(FLAGS_address);
  GrpcTransport transport(grpc::CreateChannel(address, credentials), request, BearerToken(),
                          absl::GetFlag(FLAGS_timeout_s));
  transport.set_distinct_tail_tokens(absl::GetFlag(FLAGS_distinct_tail_tokens));
  *transport_name = "grpc " + address;
  return std::printf("%s", RunLoad(transport, load).report.c_str()) < 0;
}

int RunOverHttp(const v1::GenerateRequest& request, const LoadOptions& load,
                std::string* transport_name) {
  const std::string address = absl::GetFlag(FLAGS_http_address);
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return Usage("--http-address: want IP:PORT, found \"" + address + "\"");
  }
  // The HTTP client connects to an address, without resolving a name.
  const std::string ip = address.substr(0, colon);
  in6_addr parsed;
  if (inet_pton(AF_INET, ip.c_str(), &parsed) != 1 &&
      inet_pton(AF_INET6, ip.c_str(), &parsed) != 1) {
    return Usage(
        "--http-address: want IP:PORT with an IPv4 or IPv6 address, not a host name, found \"" +
        address + "\"");
  }
  if (port < 1 || port > 65535) {
    return Usage("--http-address: the port must be in [1, 65535], found " + std::to_string(port));
  }
  HttpTransport transport(address.substr(0, colon), port, request, BearerToken(),
                          absl::GetFlag(FLAGS_timeout_s));
  transport.set_distinct_tail_tokens(absl::GetFlag(FLAGS_distinct_tail_tokens));
  *transport_name = "http " + address + " (OpenAI /v1/completions, stream)";
  return std::printf("%s", RunLoad(transport, load).report.c_str()) < 0;
}

// Counts the engine's steps and the sequences they computed. The engine
// thread adds; the load's thread reads (atomics).
class StepCounter : public EngineObserver {
 public:
  void OnStep(const StepReport& report) override {
    steps_.fetch_add(1);
    sequences_.fetch_add(report.num_sequences);
    finished_by_counted_steps_.store(finished_.load());
  }
  // Called before the request's final update reaches its client.
  void OnRequestFinished(const GenerationRequest&, const GenerationUpdate&) override {
    finished_.fetch_add(1);
  }
  // A client sees its request end before the engine reports the step that
  // ended it: waits (up to a second) for that report.
  void AwaitLastStep() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (finished_by_counted_steps_.load() != finished_.load() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  }
  int64_t steps() const { return steps_.load(); }
  int64_t sequences() const { return sequences_.load(); }

 private:
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> sequences_{0};
  std::atomic<int64_t> finished_{0};
  std::atomic<int64_t> finished_by_counted_steps_{0};
};

int RunInProcess(const v1::GenerateRequest& request, LoadOptions load,
                 std::string* transport_name) {
  absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  if (!absl::GetFlag(FLAGS_model).empty()) {
    return Usage("--model is a server flag; give the model as --engine-model");
  }
  options->model_dir = absl::GetFlag(FLAGS_engine_model);
  absl::StatusOr<EngineSetup> setup = SetUpEngine(*options);
  if (!setup.ok()) return Usage(setup.status().ToString());
  const ModelConfig& config = setup->model->config;
  RequestLimits limits;
  limits.vocab_size = config.vocab_size;
  limits.context_length = config.max_seq_len;
  limits.priority_scheduling = true;  // the engine orders by priority whatever it is
  absl::StatusOr<GenerationRequest> validated =
      ValidateGenerateRequest(request, *setup->model->tokenizer, limits);
  if (!validated.ok()) return Usage(validated.status().ToString());
  validated->stream_interval = options->stream_interval;  // a streaming client, as over gRPC

  StepCounter counter;
  GenerationEngine engine(setup->engine_options, setup->backend.get(), setup->kv_cache.get(),
                          setup->model->tokenizer.get(), &counter);
  engine.Start();
  if (absl::Status status = WarmUpEngine(engine, config); !status.ok()) {
    return Usage(status.ToString());
  }
  EngineTransport transport(&engine, *std::move(validated), absl::GetFlag(FLAGS_timeout_s));
  transport.set_distinct_tail_tokens(absl::GetFlag(FLAGS_distinct_tail_tokens));
  *transport_name =
      absl::StrFormat("engine in-process (%s, threads %s)", options->model_dir,
                      options->threads == 0 ? "all" : std::to_string(options->threads));
  // Every warm-up request has ended when the timed ones start.
  int64_t steps_before = 0, sequences_before = 0;
  load.on_timed_start = [&] {
    counter.AwaitLastStep();
    steps_before = counter.steps();
    sequences_before = counter.sequences();
  };
  const LoadResult result = RunLoad(transport, load);
  engine.Stop();
  // How full the batches were: a closed loop over gRPC runs more, emptier
  // steps when the next requests arrive late (docs/performance.md).
  const int64_t steps = counter.steps() - steps_before;
  const int64_t sequences = counter.sequences() - sequences_before;
  return std::printf(
             "%sengine steps: %lld during the load, %.2f sequences per step\n",
             result.report.c_str(), static_cast<long long>(steps),
             steps > 0 ? static_cast<double>(sequences) / static_cast<double>(steps) : 0.0) < 0;
}

int Run() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  LoadOptions load;
  load.mode = mode == "open" ? LoadMode::kOpen : LoadMode::kClosed;
  load.concurrency = absl::GetFlag(FLAGS_concurrency);
  load.rate_per_s = absl::GetFlag(FLAGS_rate);
  load.requests = absl::GetFlag(FLAGS_requests);
  load.seed = absl::GetFlag(FLAGS_seed);
  load.warmup_requests = absl::GetFlag(FLAGS_warmup_requests);
  if (mode != "closed" && mode != "open") {
    return Usage(absl::StrCat("--mode: expected closed or open, found \"", mode, "\""));
  }
  if (load.requests < 1)
    return Usage(absl::StrCat("--requests: must be >= 1, found ", load.requests));
  if (load.concurrency < 1) {
    return Usage(absl::StrCat("--concurrency: must be >= 1, found ", load.concurrency));
  }
  if (load.warmup_requests < 0) {
    return Usage(absl::StrCat("--warmup-requests: must be >= 0, found ", load.warmup_requests));
  }
  // Arrival gaps and deadlines become integer clock ticks: NaN, infinity and
  // values past these overflowed them (every request past its deadline at
  // once, arrivals at undefined times).
  constexpr double kMinRate = 1e-6, kMaxRate = 1e9, kMaxTimeoutS = 1e6;
  if (!(load.rate_per_s >= kMinRate && load.rate_per_s <= kMaxRate)) {
    return Usage(absl::StrCat("--rate: must be in [", kMinRate, ", ", kMaxRate,
                              "] requests a second, found ", load.rate_per_s));
  }
  if (const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
      !(timeout_s > 0 && timeout_s <= kMaxTimeoutS)) {
    return Usage(
        absl::StrCat("--timeout-s: must be in (0, ", kMaxTimeoutS, "] seconds, found ", timeout_s));
  }
  absl::StatusOr<v1::GenerateRequest> request = RequestFromFlags();
  if (!request.ok()) return Usage(std::string(request.status().message()));

  const int distinct_tail = absl::GetFlag(FLAGS_distinct_tail_tokens);
  if (distinct_tail != 0 && (!request->has_token_ids() || distinct_tail < 0 ||
                             distinct_tail > request->token_ids().ids_size())) {
    return Usage(absl::StrCat("--distinct-tail-tokens: wants --prompt-ids and at most its ",
                              request->token_ids().ids_size(), " ids, found ", distinct_tail));
  }
  std::string prompt = request->has_token_ids()
                           ? absl::StrCat(request->token_ids().ids_size(), " tokens")
                           : absl::StrCat(request->text().size(), " bytes");
  if (distinct_tail > 0) absl::StrAppend(&prompt, " (the last ", distinct_tail, " each its own)");
  std::printf(
      "switchserve-bench: %s loop, %s, %d requests (after %d warm-up), prompt %s, %d new "
      "tokens\n",
      mode.c_str(),
      load.mode == LoadMode::kClosed ? absl::StrCat("concurrency ", load.concurrency).c_str()
                                     : absl::StrCat("rate ", load.rate_per_s, "/s").c_str(),
      load.requests, load.warmup_requests, prompt.c_str(), absl::GetFlag(FLAGS_max_new_tokens));
  std::string transport;
  const int rc =
      !absl::GetFlag(FLAGS_engine_model).empty()   ? RunInProcess(*request, load, &transport)
      : !absl::GetFlag(FLAGS_http_address).empty() ? RunOverHttp(*request, load, &transport)
                                                   : RunOverGrpc(*request, load, &transport);
  if (rc == 0) std::printf("transport: %s\n", transport.c_str());
  return rc;
}

}  // namespace
}  // namespace switchserve::bench

int main(int argc, char** argv) {
  // The in-process engine links OpenBLAS; its pool's start-up spin took a
  // core from the server under test or the in-process engine at the start
  // of every run (measured: it doubled the load generator's CPU per token in
  // a 64-request, one-client gRPC run).
  switchserve::cpu::RestartWithoutBlasThreads(argv);
  switchserve::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage(
      "switchserve-bench {--address HOST:PORT | --http-address IP:PORT | --engine-model DIR "
      "[--threads N]} "
      "[--mode closed --concurrency N | --mode open --rate R] --requests N");
  // --help lists this file's flags (absl looks for a file named after the
  // program, which has a hyphen); --helpfull adds the engine's.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "bench/load/switchserve_bench.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  switchserve::NormalizeFlagNames(argc, argv);
  // absl drops words no flag takes (`--ignore-eos false` left it true).
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    return switchserve::bench::Usage(absl::StrCat("unexpected argument \"", rest[1], "\""));
  }
  return switchserve::bench::Run();
}
