// `switchserve serve`: loads the model, starts the engine thread and the gRPC
// server, and drains gracefully on SIGTERM / SIGINT / SIGHUP.
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/model/host_cpus.h"
#include "engine/model/host_memory.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/generation_engine.h"
#include "google/protobuf/stubs/logging.h"
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/auth.h"
#include "server/byte_budget.h"
#include "server/call_gate.h"
#include "server/commands.h"
#include "server/common_flags.h"
#include "server/dispatch_flags.h"
#include "server/engine_setup.h"
#include "server/generation_service.h"
#include "server/http/http_server.h"
#include "server/http/openai_service.h"
#include "server/log.h"
#include "server/metrics/engine_metrics_observer.h"
#include "server/metrics/metrics_exposer.h"
#include "server/metrics/moe_metrics.h"
#include "server/metrics/output_buffer_metrics.h"
#include "server/metrics/serving_metrics.h"
#include "server/proto_convert.h"
#include "server/server_flags.h"
#include "server/thread_priority.h"
#include "server/version.h"

namespace switchserve {
namespace {

// Concurrent calls one gRPC connection may hold (HTTP/2 streams; a client
// with more opens another connection).
constexpr int kMaxStreamsPerConnection = 256;

// gRPC's memory quota: a quarter of the host's memory, at most 1 GiB.
int64_t GrpcMemoryBytes() { return std::min<int64_t>(HostMemoryBytes() / 4, int64_t{1} << 30); }

// A server-wide byte budget: `flag_bytes` when given (> 0), else as much as
// gRPC's buffers; never less than `at_least` (room for one holder's largest
// share). The HTTP request bodies held at once (--http-body-buffer-bytes, at
// least one body of --max-request-bytes) and the output waiting for clients
// (--output-buffer-bytes, at least one stream's --max-stream-buffer-bytes).
int64_t BudgetBytes(int64_t flag_bytes, int64_t at_least) {
  return std::max(flag_bytes > 0 ? flag_bytes : GrpcMemoryBytes(), at_least);
}
int64_t HttpBodyBytes(const ServerOptions& options) {
  return BudgetBytes(options.http_body_buffer_bytes, options.max_request_bytes);
}

void Log(const std::string& message) { LogInfo(message); }

// --noreflection: linking grpc++_reflection registers its plugin with every
// ServerBuilder; this option takes it out again.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
      return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(plugin.get()) != nullptr;
    });
  }
};

int Fail(const absl::Status& status) {
  switchserve::Log(LogLevel::kError, status.ToString());
  return 1;
}

// Why a listener on host:port cannot be opened, as "bind: Address already in
// use": asked again with a socket of our own after gRPC's listener (or
// civetweb's) failed, whose own reports do not say (gRPC's buried in a
// library error line, civetweb's "null context when constructing
// CivetServer"). Empty when this socket binds.
std::string WhyCannotListen(const std::string& host, int port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int error = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    return absl::StrCat("resolve: ", gai_strerror(error));
  }
  std::string why;
  for (const addrinfo* a = found; a != nullptr && why.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = absl::StrCat("socket: ", std::strerror(errno));
      break;
    }
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0)
      why = absl::StrCat("bind: ", std::strerror(errno));
    close(fd);
  }
  freeaddrinfo(found);
  return why;
}

// `what` "cannot listen on host:port", with the reason when one is found.
absl::Status CannotListen(const std::string& what, const std::string& host, int port,
                          const absl::Status& fallback) {
  const std::string why = WhyCannotListen(host, port);
  if (why.empty()) return fallback;
  return absl::UnavailableError(
      absl::StrCat(what, "cannot listen on ", HostPort(host, port), " (", why, ")"));
}

int Milliseconds(double seconds) { return static_cast<int>(seconds * 1000.0 + 0.5); }

// Raises the soft limit on open files to the hard one: every connection
// takes a descriptor, and a server out of them refuses connections (gRPC
// 1.51's listener stops accepting for good). Returns the limit in force.
rlim_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  }
  return limit.rlim_cur;
}

// Connection age and keepalive (docs/deploy.md, "Scaling out").
void SetConnectionArguments(const ConnectionOptions& c, grpc::ServerBuilder* builder) {
  if (c.max_connection_age_s > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                                Milliseconds(c.max_connection_age_s));
  }
  if (c.max_connection_age_grace_s > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                Milliseconds(c.max_connection_age_grace_s));
  }
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                              c.keepalive_time_s > 0 ? Milliseconds(c.keepalive_time_s) : INT_MAX);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(c.keepalive_timeout_s));
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              Milliseconds(c.keepalive_min_client_interval_s));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

std::string ConnectionSummary(const ConnectionOptions& c) {
  auto seconds = [](double s, const char* zero) {
    return s > 0 ? absl::StrCat(s, " s") : std::string(zero);
  };
  return absl::StrCat("connections: max age ", seconds(c.max_connection_age_s, "unlimited"),
                      " (grace ", seconds(c.max_connection_age_grace_s, "unlimited"),
                      "), keepalive ", seconds(c.keepalive_time_s, "off"), " (timeout ",
                      c.keepalive_timeout_s,
                      " s), client pings every >= ", c.keepalive_min_client_interval_s, " s");
}

// The thread that takes the stop signals in sigwait (RunServeCommand's).
pthread_t g_stop_signal_thread;

// Set once gRPC's listener has failed an accept: gRPC 1.51 then closes the
// listening socket for good (EMFILE, ENFILE, ENOBUFS, ENOMEM: CVE-2023-4785),
// and a server that takes no new connections is restarted best by its
// supervisor, so it drains and exits with an error.
std::atomic<bool> g_grpc_listener_lost{false};

// gRPC core's error lines, and libprotobuf's, a second at most each: a
// client can make gRPC write one with every call (a malformed grpc-encoding
// or grpc-timeout header: "Error parsing metadata", the value quoted).
constexpr int kLibraryErrorLinesPerSecond = 10;

// gRPC core's own lines ("Failed accept4", ...) in the server's log format.
// Its errors past kLibraryErrorLinesPerSecond are dropped, and the next one
// written counts them (`suppressed=`); its info and debug lines, which only
// GRPC_VERBOSITY asks for, are not limited.
void LogGrpcLine(gpr_log_func_args* args) {
  static LogLineBudget error_budget(kLibraryErrorLinesPerSecond, std::chrono::seconds(1));
  const bool error = args->severity == GPR_LOG_SEVERITY_ERROR;
  int64_t suppressed = 0;
  if (!error || error_budget.Admit(LogLineBudget::Clock::now(), &suppressed)) {
    LogFields fields = {{"source", absl::StrCat(args->file, ":", args->line)}};
    if (suppressed > 0) fields["suppressed"] = suppressed;
    Log(error ? LogLevel::kError : LogLevel::kInfo, absl::StrCat("grpc: ", args->message), fields);
  }
  // gRPC logs this only while its listeners are meant to be open.
  if (absl::StartsWith(args->message, "Failed accept4") && !g_grpc_listener_lost.exchange(true)) {
    pthread_kill(g_stop_signal_thread, SIGTERM);
  }
}

// Refused HTTP connections are counted, and logged at most every 10 s.
class RefusedConnections {
 public:
  explicit RefusedConnections(ServingMetrics* metrics) : metrics_(metrics) {}

  void Add(int64_t limit) {
    if (metrics_ != nullptr) metrics_->RecordHttpConnectionRefused();
    std::lock_guard<std::mutex> lock(mu_);
    ++unlogged_;
    const absl::Time now = absl::Now();
    if (now - logged_at_ < absl::Seconds(10)) return;
    Log(LogLevel::kWarning,
        absl::StrCat("HTTP: ", unlogged_, unlogged_ == 1 ? " connection" : " connections",
                     " closed as accepted: ", limit,
                     " were open (--http-max-connections; 0 is half the open-file limit)"));
    logged_at_ = now;
    unlogged_ = 0;
  }

 private:
  ServingMetrics* const metrics_;
  std::mutex mu_;
  absl::Time logged_at_ = absl::InfinitePast();
  int64_t unlogged_ = 0;
};

// The startup log's account of the step's CPU threads: the number the
// backend runs, and where it came from when --threads left it open.
std::string DescribeComputeThreads(const Backend& backend, int requested) {
  const int threads = backend.compute_threads();
  if (threads == 0) return "none (its steps run on the device)";
  if (requested > 0) return absl::StrCat(threads);
  const HostCpus cpus = AvailableCpus();
  if (threads < cpus.count) return absl::StrCat(threads, " (OMP_NUM_THREADS)");
  return absl::StrCat(threads, cpus.quota_limited ? " (the cgroup's CPU quota)" : " (all CPUs)");
}

// libprotobuf's own lines (a request's string field that is not UTF-8, ...)
// in the server's log format rather than as plain text on stderr. Its
// errors are about the data it parsed, which the call's status already
// reports to its client: warnings here. A client can cause one with every
// call, so they are limited as gRPC's errors are (all but a fatal one).
void LogProtobufLine(google::protobuf::LogLevel level, const char* file, int line,
                     const std::string& message) {
  static LogLineBudget budget(kLibraryErrorLinesPerSecond, std::chrono::seconds(1));
  const bool fatal = level == google::protobuf::LOGLEVEL_FATAL;
  int64_t suppressed = 0;
  if (!fatal && !budget.Admit(LogLineBudget::Clock::now(), &suppressed)) return;
  LogFields fields = {{"source", absl::StrCat(file, ":", line)}};
  if (suppressed > 0) fields["suppressed"] = suppressed;
  Log(fatal ? LogLevel::kError : LogLevel::kWarning, absl::StrCat("protobuf: ", message), fields);
}

// Sets `*up` once the server is up (before it logs its settings).
int Serve(const ServerOptions& options, const sigset_t& stop_signals, bool* up) {
  // Credentials and the token first: a typo there is reported in a second,
  // not after the model has loaded and warmed up.
  auto credentials = MakeServerCredentials(options.tls);
  if (!credentials.ok()) return Fail(credentials.status());
  std::unique_ptr<BearerTokenAuth> auth;
  if (!options.auth_token_file.empty()) {
    auto loaded = BearerTokenAuth::FromFile(options.auth_token_file);
    if (!loaded.ok()) return Fail(loaded.status());
    auth = std::move(*loaded);
  }
  const rlim_t open_files = RaiseOpenFileLimit();
  ServerOptions resolved = options;
  if (resolved.model_dir.empty()) resolved.model_dir = DefaultModelDirectory();
  LogInfo("starting switchserve", {{"version", Version()}, {"revision", Revision()}});
  Log(absl::StrCat("loading model from ", resolved.model_dir));
  absl::StatusOr<EngineSetup> setup = SetUpEngine(resolved);
  if (!setup.ok()) return Fail(setup.status());
  for (const std::string& warning : setup->model->warnings) {
    switchserve::Log(LogLevel::kWarning, warning);
  }
  const std::string& model_dir = resolved.model_dir;
  const ModelConfig& config = setup->model->config;
  // The gRPC ModelInfo's name, the HTTP API's `model`, switchserve_model_info.
  const std::string model_name = ServedModelName(options.served_model_name, config, model_dir);
  const DispatchConfig& dispatch = setup->dispatch;
  Backend* backend = setup->backend.get();
  if (options.device == DeviceKind::kAuto) {
    Log(absl::StrCat("--device auto: using the ", std::string(backend->name()), " backend"));
  }
  const EngineOptions& engine_options = setup->engine_options;
  const KvCache& kv_cache = *setup->kv_cache;
  // As the flag spells it: "f32" or "bf16".
  const std::string kv_cache_dtype =
      absl::AsciiStrToLower(std::string(ToString(backend->kv_cache_dtype())));
  if (options.debug_step_delay_ms > 0) {
    Log(absl::StrCat("--debug-step-delay-ms ", options.debug_step_delay_ms,
                     ": every engine step is slowed down (testing aid)"));
  }
  // One budget for the output waiting for clients: gRPC's and HTTP's
  // streams, HTTP's unary responses.
  const auto output_budget = std::make_shared<ByteBudget>(
      BudgetBytes(options.output_buffer_bytes, options.max_stream_buffer_bytes));
  // Metrics: the engine observer feeds them once per step and per finished
  // request; the exposer serves them from its own threads.
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<ServingMetrics> serving_metrics;
  std::shared_ptr<MoeMetrics> moe_metrics;
  std::unique_ptr<EngineMetricsObserver> observer;
  std::unique_ptr<MetricsExposer> exposer;
  if (options.metrics_port != 0) {
    registry = std::make_shared<prometheus::Registry>();
    serving_metrics = std::make_unique<ServingMetrics>(*registry);
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {registry};
    collectables.push_back(std::make_shared<OutputBufferMetrics>(
        [output_budget] { return output_budget->used(); }, output_budget->limit()));
    if (options.moe_metrics) {
      moe_metrics = std::make_shared<MoeMetrics>(RouterLayout(config).routers());
      collectables.push_back(moe_metrics);
    }
    observer = std::make_unique<EngineMetricsObserver>(serving_metrics.get(), moe_metrics.get(),
                                                       kv_cache.num_blocks());
    RegisterModelInfo(
        *registry,
        {.model = model_name,
         .device = std::string(backend->name()),
         .architecture = ArchitectureName(config),
         .tokenizer = config.tokenizer == TokenizerKind::kByte ? "byte" : "sentencepiece",
         .context_length = config.max_seq_len,
         .kv_cache_dtype = kv_cache_dtype});
    RegisterBuildInfo(*registry, Version(), Revision());
    auto started = MetricsExposer::Start(options.metrics_host, options.metrics_port, collectables);
    if (!started.ok()) {
      return Fail(
          CannotListen("metrics: ", options.metrics_host, options.metrics_port, started.status()));
    }
    exposer = std::move(*started);
  }
  GenerationEngine engine(engine_options, backend, setup->kv_cache.get(),
                          setup->model->tokenizer.get(), observer.get());
  engine.Start();
  if (absl::Status status = WarmUpEngine(engine, config); !status.ok()) return Fail(status);
  // The engine's compute threads exist now; every other thread, and those
  // started from here on (gRPC's server, HTTP), at a higher nice value.
  std::string serving_nice = "as the engine's";
  if (options.serving_threads_nice > 0) {
    if (absl::Status status = LowerServingThreadsPriority(options.serving_threads_nice);
        status.ok()) {
      serving_nice = absl::StrCat("nice +", options.serving_threads_nice);
    } else {
      switchserve::Log(LogLevel::kWarning,
                       absl::StrCat("--serving-threads-nice: ", status.ToString()));
    }
  }

  CallGate gate;
  GenerationServiceOptions service_options;
  service_options.engine = &engine;
  service_options.tokenizer = setup->model->tokenizer.get();
  service_options.config = &config;
  service_options.model_name = model_name;
  service_options.dispatch = dispatch;
  service_options.device = std::string(backend->name());
  service_options.limits.vocab_size = config.vocab_size;
  service_options.limits.context_length = config.max_seq_len;
  service_options.limits.priority_scheduling = options.priority_scheduling;
  service_options.auth = auth.get();
  service_options.max_metadata_bytes = options.max_metadata_bytes;
  service_options.metrics = serving_metrics.get();
  service_options.gate = &gate;
  service_options.stream_interval = options.stream_interval;
  service_options.stream_write_timeout_s = options.stream_write_timeout_s;
  service_options.max_stream_buffer_bytes = options.max_stream_buffer_bytes;
  service_options.output_budget = output_budget;
  GenerationService service(service_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  const std::string address = ListenAddress(options);
  builder.AddListeningPort(address, *credentials, &bound_port);
  // No SO_REUSEPORT (gRPC's default): a second server on a port in use fails
  // to start instead of sharing it, unseen, with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_request_bytes));
  // gRPC 1.51 answers headers over this limit by failing every call on the
  // connection; the service enforces --max-metadata-bytes per call instead,
  // below it (GenerationService), so an oversized call fails alone.
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE,
                             static_cast<int>(options.TransportMetadataLimit()));
  SetConnectionArguments(options.connections, &builder);
  // What a few clients can make gRPC hold: streams per connection, and the
  // memory of every connection's buffers together (a client that parks
  // unfinished 4 MiB messages meets these instead of the host's memory; one
  // that resets streams as fast as it opens them does not, in gRPC 1.51:
  // docs/deploy.md).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  const int64_t grpc_memory_bytes = GrpcMemoryBytes();
  grpc::ResourceQuota quota("switchserve-grpc");
  quota.Resize(static_cast<size_t>(grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.RegisterService(&service);
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  // A start-up that fails from here on (an error returned, or an exception:
  // a thread of the HTTP API the system refuses to create) leaves gRPC's
  // server to the process's end (RunServeCommand ends a failed start-up at
  // once). Destroying it waits for the timer threads of gRPC's event engine,
  // one of which a thread limit may have kept from starting: the server hung
  // for ever, before its error line, with the stop signals blocked.
  const absl::Cleanup leave_server_if_not_up = [&server, up] {
    if (!*up) static_cast<void>(server.release());
  };
  if (server == nullptr || bound_port == 0) {
    return Fail(CannotListen("", options.host, options.port,
                             absl::UnavailableError(absl::StrCat("cannot listen on ", address))));
  }
  // The OpenAI-compatible HTTP API: same engine, gate, token, TLS and limits.
  OpenAiService openai(
      {.engine = &engine,
       .tokenizer = setup->model->tokenizer.get(),
       .limits = service_options.limits,
       .model_name = model_name,
       .auth = auth.get(),
       .metrics = serving_metrics.get(),
       .metrics_text = exposer == nullptr ? std::function<std::string()>()
                                          : [metrics = exposer.get()] { return metrics->Render(); },
       .gate = &gate,
       .created_unix_s = absl::ToUnixSeconds(absl::Now()),
       .stream_interval = options.stream_interval,
       .max_prompts = options.max_queue,
       .output_budget = output_budget});
  std::unique_ptr<HttpServer> http;
  RefusedConnections refused_connections(serving_metrics.get());
  if (options.http_port != 0) {
    auto started = HttpServer::Start(
        {.host = options.host,
         .port = options.http_port,
         .tls = options.tls,
         .max_body_bytes = options.max_request_bytes,
         .max_buffered_body_bytes = HttpBodyBytes(options),
         .max_stream_buffer_bytes = options.max_stream_buffer_bytes,
         .output_budget = output_budget,
         .max_connection_age_s = options.connections.max_connection_age_s,
         .max_connections = options.http_max_connections,
         .on_connection_refused =
             [&refused_connections](int64_t limit) { refused_connections.Add(limit); },
         .error_body = OpenAiErrorBody,
         .on_own_error = [&openai](const HttpRequest& head,
                                   HttpResponse* response) { openai.OnOwnError(head, response); },
         .check_head = [&openai](const HttpRequest& head) { return openai.CheckHead(head); },
         .allowed_origins = options.allowed_origins},
        [&openai](std::shared_ptr<HttpExchange> exchange) { openai.Handle(exchange); });
    if (!started.ok()) return Fail(started.status());
    http = std::move(*started);
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(v1::Generation::service_full_name(), true);
  health->SetServingStatus(true);
  *up = true;

  Log(absl::StrFormat(
      "model %s (%s): %s, %d layers, d_model %d, vocab %d, context %d, tokenizer %s", model_name,
      model_dir, ArchitectureName(config), config.n_layers, config.d_model, config.vocab_size,
      config.max_seq_len, config.tokenizer == TokenizerKind::kByte ? "byte" : "sentencepiece"));
  Log(absl::StrCat("dispatch: ", DescribeDispatch(dispatch)));
  if (const std::string warning = SharedCapacityWarning(dispatch); !warning.empty()) {
    switchserve::Log(LogLevel::kWarning, warning);
  }
  const std::string kernels =
      backend->kernels().empty() ? ""
                                 : absl::StrCat(" (", std::string(backend->kernels()), " kernels)");
  Log(absl::StrFormat(
      "backend %s%s, threads %s, serving threads %s; KV cache %d blocks x %d tokens = %d tokens "
      "(%d MiB, %d bytes per token, %s; --kv-cache-dtype %s)",
      std::string(backend->name()), kernels, DescribeComputeThreads(*backend, options.threads),
      serving_nice, kv_cache.num_blocks(), kv_cache.block_size(), kv_cache.capacity_tokens(),
      kv_cache.bytes() >> 20, kv_cache.bytes_per_token(), kv_cache_dtype,
      std::string(ToString(options.kv_cache_dtype))));
  const WeightCopies copies = backend->weight_copies();
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  if (copies.bytes > 0) {
    Log(absl::StrFormat(
        "weight copies for batch-1 decode: %.1f MiB of host memory (--cpu-weight-copies=false "
        "goes without)",
        mib(copies.bytes)));
  } else if (copies.skipped_bytes > 0) {
    switchserve::Log(
        LogLevel::kWarning,
        absl::StrFormat("weight copies for batch-1 decode: off: their %.1f MiB do not fit beside "
                        "the weights (%.1f MiB) and the KV cache (%d MiB) in %.1f MiB (90%% of "
                        "this host's memory); batch-1 decode reads the weights as stored (same "
                        "logits, slower)",
                        mib(copies.skipped_bytes), mib(setup->model->weights.Bytes()),
                        kv_cache.bytes() >> 20, mib(copies.budget_bytes)));
  } else if (!options.cpu_weight_copies) {
    Log("weight copies for batch-1 decode: off (--cpu-weight-copies=false)");
  }
  Log(absl::StrFormat(
      "scheduler: max_batch_tokens %d, max_running_requests %d, max_queue %d, "
      "stream_interval %d, max_request_bytes %d, drain_timeout_s %g, prefix "
      "caching %s, scheduling policy %s",
      options.max_batch_tokens, options.max_running_requests, options.max_queue,
      options.stream_interval, options.max_request_bytes, options.drain_timeout_s,
      options.prefix_caching ? "on" : "off", options.priority_scheduling ? "priority" : "fcfs"));
  Log(absl::StrFormat("security: %s, %s",
                      !options.tls.enabled()               ? "plaintext"
                      : options.tls.client_ca_file.empty() ? "TLS"
                                                           : "mTLS (client certificates required)",
                      auth ? "bearer token required" : "no authentication"));
  Log(absl::StrCat(ConnectionSummary(options.connections), "; open files up to ", open_files,
                   "; gRPC: ", kMaxStreamsPerConnection, " calls a connection, buffers up to ",
                   grpc_memory_bytes >> 20, " MiB; output waiting for clients up to ",
                   options.max_stream_buffer_bytes, " bytes a stream, ", output_budget->limit(),
                   " in all"));
  if (exposer != nullptr) {
    Log(absl::StrCat("metrics on http://", HostPort(options.metrics_host, exposer->port()),
                     "/metrics",
                     moe_metrics ? "" : " (--no-moe-metrics: serving and process only)"));
  } else {
    Log("metrics disabled (--metrics-port 0)");
  }
  if (http != nullptr) {
    Log(absl::StrCat("HTTP API on ", options.tls.enabled() ? "https://" : "http://",
                     HostPort(options.host, http->port()),
                     " (OpenAI-compatible: /v1/completions, /v1/models; /health, /ready; model \"",
                     model_name, "\"; up to ",
                     options.http_max_connections > 0
                         ? absl::StrCat(options.http_max_connections)
                         : absl::StrCat(open_files / 2, " (half the open-file limit)"),
                     " connections, request bodies up to ", HttpBodyBytes(options),
                     " bytes in all)"));
  }
  Log(absl::StrCat("listening on ", HostPort(options.host, bound_port),
                   " (grpc: switchserve.v1.Generation, grpc.health.v1.Health",
                   options.reflection ? ", reflection)" : ")"));

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  const bool listener_lost = g_grpc_listener_lost;
  Log(listener_lost ? LogLevel::kError : LogLevel::kInfo,
      absl::StrCat(listener_lost ? "the gRPC port accepts no more connections (gRPC does not "
                                   "resume after a failed accept)"
                                 : absl::StrCat("received ", strsignal(signal_number)),
                   ": draining (", gate.calls_in_flight(), " calls running, up to ",
                   options.drain_timeout_s, " s)",
                   listener_lost ? ", then exiting with status 1 to be restarted" : ""));
  health->SetServingStatus(false);
  gate.StartDraining();
  const bool drained = gate.WaitUntilIdle(MillisecondsFromSeconds(options.drain_timeout_s));
  if (!drained) {
    gate.EndRunningCalls();
    // Calls cut off by the server rather than finished: a warning, which a
    // log pipeline selecting warnings and errors sees.
    const int cancelled = gate.calls_in_flight();
    switchserve::Log(LogLevel::kWarning, absl::StrCat("drain timeout: cancelling ", cancelled,
                                                      cancelled == 1 ? " call" : " calls"));
  }
  engine.Stop();  // ends whatever is left; those calls get UNAVAILABLE
  // Every Generate call has its final update now; once gRPC has sent their
  // statuses (each call's OnDone) and no new call has been refused for a
  // moment, nothing of ours is running, and the shutdown need not wait for
  // idle client connections to go away. After the drain's timeout the calls
  // left are ended, not waited for: an HTTP response whose client reads
  // nothing would hold each wait below to its end (4 s more in all).
  constexpr auto kQuiet = std::chrono::milliseconds(200);
  gate.WaitUntilQuiet(kQuiet, drained ? std::chrono::milliseconds(2000) : kQuiet);
  server->Shutdown(std::chrono::system_clock::now());
  server->Wait();
  openai.Stop();  // the unary responses still being rendered go to their exchanges
  if (http != nullptr) {
    http->Stop(drained ? std::chrono::milliseconds(2000) : std::chrono::milliseconds(0));
  }
  Log("stopped");
  return listener_lost ? 1 : 0;
}

// The stop signals' handler. It runs only on a thread that left them
// unblocked: one a library started before RunServeCommand blocked them
// (OpenBLAS starts its threads when it is loaded). With the default action a
// signal delivered there ended the process: a second SIGTERM during the drain
// killed the server, and so did one during start-up. Sent on to the sigwait
// thread, it is pending there: the drain starts when the server reaches
// sigwait, and a signal during the drain changes nothing.
extern "C" void ForwardStopSignal(int signal_number) {
  pthread_kill(g_stop_signal_thread, signal_number);
}

}  // namespace

int RunServeCommand(int argc, char** argv) {
  // Every thread created from here on (gRPC, engine, OpenMP) inherits the
  // mask; only this thread receives the stop signals, in sigwait. Blocked
  // here before the handler is set, the handler never runs on this thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  // The terminal that started the server closed: a drain, as for SIGTERM,
  // rather than the default action's end of every running call.
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  g_stop_signal_thread = pthread_self();
  struct sigaction forward = {};
  forward.sa_handler = ForwardStopSignal;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &forward, nullptr);
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGHUP, &forward, nullptr);
  // A write to a closed pipe fails (EPIPE) rather than ending the process:
  // the log's stderr may be a pipe whose reader went away (a log shipper,
  // `| head`), and the server then went on serving only with the metrics
  // exporter on (civetweb ignores SIGPIPE) and was killed at its next log
  // line without it, running calls and all.
  signal(SIGPIPE, SIG_IGN);

  absl::ParseCommandLine(argc, argv);  // main() already turned --a-b into --a_b
  auto options = ServerOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "switchserve serve: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  SetLogFormat(options->log_format);
  gpr_set_log_function(LogGrpcLine);
  google::protobuf::SetLogHandler(LogProtobufLine);
  // gRPC stays initialised until Serve has returned: the last reference
  // dropped runs gRPC's teardown (grpc_shutdown), which waits for every
  // thread gRPC counted as started. One the system refused to create (a
  // thread limit: RLIMIT_NPROC) never ends, and a start-up that failed hung
  // there for ever, in the unwinding before its error line was written.
  grpc_init();
  int code = 1;
  bool up = false;
  // An exception that ends the start-up (a thread the system refuses to
  // create: std::system_error; an allocation that fails) is reported here,
  // in the log's format, rather than as main()'s plain line after the JSON
  // ones.
  try {
    code = Serve(*options, stop_signals, &up);
  } catch (const std::bad_alloc&) {
    switchserve::Log(LogLevel::kError, "out of memory");
  } catch (const std::exception& e) {
    switchserve::Log(LogLevel::kError, e.what());
  }
  if (!up) {
    // A start-up that failed (its error line written: every line is
    // flushed) ends here, without gRPC's teardown or the exit's, which can
    // wait for ever as above: its supervisor restarts it.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  grpc_shutdown();
  return code;
}

}  // namespace switchserve
