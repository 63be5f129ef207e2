#include "server/server_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common_flags.h"
#include "server/dispatch_flags.h"

// The defaults of every `serve` flag live here, as literals (deployment
// tooling reads them from this file: tests/deploy/server_facts.py).
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 picks a free port (logged)");
ABSL_FLAG(int, http_port, 0,
          "OpenAI-compatible HTTP API port (/v1/completions, /v1/models, /health, /ready); "
          "0 disables");
ABSL_FLAG(std::string, allowed_origins, "",
          "HTTP API: browser origins whose pages may call it (CORS), comma-separated "
          "(https://app.example.com), or * for any; empty: no CORS headers, so pages on "
          "other origins cannot read its answers");
ABSL_FLAG(int64_t, http_max_connections, 0,
          "Most HTTP API connections open at once; one past it is closed as soon as it is "
          "accepted. 0: half the open-file limit, so that HTTP clients cannot take the "
          "descriptors gRPC needs");
ABSL_FLAG(int64_t, http_body_buffer_bytes, 0,
          "Request bodies all HTTP API connections may hold at once, in bytes; a request whose "
          "body does not fit is answered 429 (Retry-After: 1). 0: a quarter of the memory "
          "limit, at most 1 GiB (as gRPC's buffers); never less than --max-request-bytes");
ABSL_FLAG(int, metrics_port, 9090, "Prometheus metrics port (/metrics); 0 disables");
ABSL_FLAG(std::string, metrics_host, "",
          "Address the metrics exporter listens on (plain HTTP, no TLS or token); empty: --host");
ABSL_FLAG(bool, reflection, true,
          "Serve gRPC reflection (not guarded by the bearer token); --noreflection turns it off");
ABSL_FLAG(bool, no_moe_metrics, false,
          "Export no MoE routing metrics (serving and process metrics only)");
ABSL_FLAG(int64_t, kv_cache_bytes, 1073741824,
          "KV cache budget in bytes (capped at max_running_requests full contexts)");
ABSL_FLAG(int64_t, max_batch_tokens, 2048,
          "Tokens computed per engine step (decode tokens + prefill chunks)");
ABSL_FLAG(int, max_running_requests, 64, "Requests in the running batch at once");
ABSL_FLAG(bool, enable_prefix_caching, false,
          "Keep the KV blocks of computed prompts (and generated text) after their requests end, "
          "and start a request whose tokens begin with a cached prefix after it: the same logits, "
          "less prefill. Cached tokens are neither computed nor routed, so the MoE metrics count "
          "only the tokens computed");
ABSL_FLAG(std::string, scheduling_policy, "fcfs",
          "fcfs | priority: with priority, requests may set `priority` (lower first); a waiting "
          "request of a higher priority preempts running ones of a lower priority");
ABSL_FLAG(int, max_queue, 1024,
          "Requests waiting for admission; beyond it calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, stream_interval, 1,
          "Streamed generations (GenerateStream, HTTP stream): the first token goes out at once, "
          "then one message per this many tokens; larger: fewer messages, less CPU per token");
ABSL_FLAG(double, stream_write_timeout_s, 60,
          "A GenerateStream whose message, or a Generate whose response, has waited this long "
          "for its client to read it is ended RESOURCE_EXHAUSTED (a stream's request cancelled); "
          "the HTTP API's write timeout is 60 s");
ABSL_FLAG(int64_t, max_stream_buffer_bytes, 4194304,
          "Output (serialized bytes) a stream (GenerateStream, a streamed HTTP completion) may "
          "hold while its client is not reading; beyond it the stream is ended "
          "(RESOURCE_EXHAUSTED) and its request cancelled");
ABSL_FLAG(int64_t, output_buffer_bytes, 0,
          "Output all responses together may hold waiting for their clients to read it, in "
          "bytes: streams' unread output (gRPC and HTTP) and non-streamed responses being "
          "written (Generate's, HTTP completions'); a stream whose output does not fit is ended "
          "the same way, such a response is refused instead (RESOURCE_EXHAUSTED / 429; "
          "INVALID_ARGUMENT / 400 when larger than the whole budget). 0: a quarter of the memory "
          "limit, at most 1 GiB (as gRPC's buffers); never less than --max-stream-buffer-bytes");
ABSL_FLAG(int64_t, max_request_bytes, 4194304,
          "Largest request message: gRPC refuses a bigger one (RESOURCE_EXHAUSTED), the HTTP API "
          "answers a bigger body 413");
ABSL_FLAG(int64_t, max_metadata_bytes, 16384,
          "Largest request metadata (headers) of a call; more is RESOURCE_EXHAUSTED for that call");
ABSL_FLAG(double, drain_timeout_s, 30,
          "On SIGTERM, SIGINT or SIGHUP, how long running calls may take to finish (inf: no "
          "limit)");
// --model, --device and --threads are shared with the offline subcommands
// (server/common_flags.h), and so are the dispatch overrides
// (server/dispatch_flags.h).
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: the server's, enables TLS (serve); the client's, for mTLS "
          "(health)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; clients must present a certificate it signed (mTLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token every Generation call (and HTTP API request) must "
          "carry, as the header \"authorization: Bearer <token>\"");
ABSL_FLAG(double, max_connection_age_s, 300,
          "Ask clients to reconnect (GOAWAY) after a connection is this old, so that new "
          "replicas get traffic; 0: never");
ABSL_FLAG(double, max_connection_age_grace_s, 0,
          "After that GOAWAY, how long running calls may go on before the connection is "
          "closed; 0: no limit");
ABSL_FLAG(double, keepalive_time_s, 60,
          "Send a keepalive ping on a connection idle this long; 0: never");
ABSL_FLAG(double, keepalive_timeout_s, 20,
          "Close a connection whose keepalive ping is unanswered for this long");
ABSL_FLAG(double, keepalive_min_client_interval_s, 10,
          "Accept client keepalive pings at most this often (also without calls)");
ABSL_FLAG(std::string, served_model_name, "",
          "Model name in the HTTP API and metrics; empty: the model's name, else its directory");
ABSL_FLAG(std::string, log_format, "text", "text | json (one JSON object per line)");
ABSL_FLAG(int, serving_threads_nice, 10,
          "Nice value added to the threads other than the engine's compute threads (gRPC, "
          "HTTP, metrics, stream writes), so that their wake-ups do not preempt a step; "
          "0 leaves them at the server's own");
ABSL_FLAG(int, debug_step_delay_ms, 0,
          "Testing aid: sleep this long in every engine step (0: off)");

namespace switchserve {
namespace {

constexpr double kMaxDurationS = 2e6;  // int32 milliseconds

// An entry of --allowed-origins: "*" alone, or an origin as a browser sends
// it: http or https, a host, an optional port, nothing after.
absl::Status CheckAllowedOrigin(const std::string& origin, size_t entries) {
  if (origin == "*") {
    if (entries == 1) return absl::OkStatus();
    return absl::InvalidArgumentError("* allows every origin: give it alone");
  }
  const size_t scheme_end = origin.find("://");
  const std::string scheme = origin.substr(0, scheme_end);
  const std::string host =
      scheme_end == std::string::npos ? std::string() : origin.substr(scheme_end + 3);
  if ((scheme != "http" && scheme != "https") || host.empty() ||
      host.find_first_of("/?#@ ") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "`", origin, "` is not an origin (scheme://host[:port], as https://app.example.com) or *"));
  }
  return absl::OkStatus();
}

absl::Status FlagError(const char* flag, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.http_port = absl::GetFlag(FLAGS_http_port);
  o.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  for (absl::string_view origin :
       absl::StrSplit(absl::GetFlag(FLAGS_allowed_origins), ',', absl::SkipWhitespace())) {
    o.allowed_origins.emplace_back(absl::StripAsciiWhitespace(origin));
  }
  o.http_body_buffer_bytes = absl::GetFlag(FLAGS_http_body_buffer_bytes);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (o.metrics_host.empty()) o.metrics_host = o.host;
  o.reflection = absl::GetFlag(FLAGS_reflection);
  o.moe_metrics = !absl::GetFlag(FLAGS_no_moe_metrics);
  absl::StatusOr<int> threads = ThreadsFromFlags();
  if (!threads.ok()) return threads.status();
  o.threads = *threads;
  o.cpu_weight_copies = absl::GetFlag(FLAGS_cpu_weight_copies);
  o.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  absl::StatusOr<int> kv_block_size = KvBlockSizeFromFlags();
  if (!kv_block_size.ok()) return kv_block_size.status();
  o.kv_block_size = *kv_block_size;
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.max_running_requests = absl::GetFlag(FLAGS_max_running_requests);
  o.max_queue = absl::GetFlag(FLAGS_max_queue);
  o.prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  if (const std::string policy = absl::GetFlag(FLAGS_scheduling_policy); policy == "priority") {
    o.priority_scheduling = true;
  } else if (policy != "fcfs") {
    return FlagError("scheduling-policy",
                     absl::StrCat("must be fcfs or priority, found \"", policy, "\""));
  }
  o.stream_interval = absl::GetFlag(FLAGS_stream_interval);
  o.stream_write_timeout_s = absl::GetFlag(FLAGS_stream_write_timeout_s);
  o.max_stream_buffer_bytes = absl::GetFlag(FLAGS_max_stream_buffer_bytes);
  o.output_buffer_bytes = absl::GetFlag(FLAGS_output_buffer_bytes);
  o.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  o.max_metadata_bytes = absl::GetFlag(FLAGS_max_metadata_bytes);
  o.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  o.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.debug_step_delay_ms = absl::GetFlag(FLAGS_debug_step_delay_ms);
  o.serving_threads_nice = absl::GetFlag(FLAGS_serving_threads_nice);
  o.connections.max_connection_age_s = absl::GetFlag(FLAGS_max_connection_age_s);
  o.connections.max_connection_age_grace_s = absl::GetFlag(FLAGS_max_connection_age_grace_s);
  o.connections.keepalive_time_s = absl::GetFlag(FLAGS_keepalive_time_s);
  o.connections.keepalive_timeout_s = absl::GetFlag(FLAGS_keepalive_timeout_s);
  o.connections.keepalive_min_client_interval_s =
      absl::GetFlag(FLAGS_keepalive_min_client_interval_s);
  o.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  auto log_format = ParseLogFormat(absl::GetFlag(FLAGS_log_format));
  if (!log_format.ok()) return FlagError("log-format", std::string(log_format.status().message()));
  o.log_format = *log_format;

  absl::StatusOr<ModelLoadOptions> load = LoadOptionsFromFlags();
  if (!load.ok()) return load.status();
  o.load = *load;
  auto device = ParseDeviceKind(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return FlagError("device", std::string(device.status().message()));
  o.device = *device;
  absl::StatusOr<KvCacheDtype> kv_dtype = KvCacheDtypeFromFlags();
  if (!kv_dtype.ok()) return kv_dtype.status();
  o.kv_cache_dtype = *kv_dtype;
  absl::StatusOr<std::optional<cpu::KernelIsa>> cpu_kernels = CpuKernelsFromFlags();
  if (!cpu_kernels.ok()) return cpu_kernels.status();
  o.cpu_kernels = *cpu_kernels;
  absl::StatusOr<DispatchOverrides> dispatch = DispatchOverridesFromFlags();
  if (!dispatch.ok()) return dispatch.status();
  o.dispatch = *dispatch;

  if (o.host.empty()) return FlagError("host", "must not be empty");
  if (const std::string problem = HostProblem(o.host); !problem.empty()) {
    return FlagError("host", problem);
  }
  if (const std::string problem = HostProblem(o.metrics_host); !problem.empty()) {
    return FlagError("metrics-host", problem);
  }
  // The exporter's HTTP server (Debian's civetweb) is built without IPv6.
  if (const std::optional<std::string> v6 = Ipv6Literal(o.metrics_host);
      v6 && o.metrics_port != 0) {
    if (!absl::GetFlag(FLAGS_metrics_host).empty()) {
      return FlagError("metrics-host",
                       absl::StrCat("the metrics exporter listens on IPv4 only: give "
                                    "an IPv4 address or a host name, found \"",
                                    o.metrics_host, "\""));
    }
    // Taken from an IPv6 --host: its IPv4 counterpart, where there is one.
    if (*v6 == "::") {
      o.metrics_host = "0.0.0.0";
    } else if (*v6 == "::1") {
      o.metrics_host = "127.0.0.1";
    } else {
      return FlagError("metrics-host", absl::StrCat("needed with --host ", o.host,
                                                    ": the metrics exporter listens on IPv4 only "
                                                    "(or --metrics-port 0)"));
    }
  }
  if (o.port < 0 || o.port > 65535) return FlagError("port", "must be in [0, 65535]");
  if (o.metrics_port < 0 || o.metrics_port > 65535) {
    return FlagError("metrics-port", "must be in [0, 65535]");
  }
  if (o.http_port < 0 || o.http_port > 65535)
    return FlagError("http-port", "must be in [0, 65535]");
  // Two listeners on one port of one address: the second bind failed after
  // the model loaded, and blamed gRPC where the exporter had bound first.
  const auto every_address = [](const std::string& host) {
    return host == "0.0.0.0" || Ipv6Literal(host) == "::";
  };
  const struct {
    const char* flag;
    int port;
    const std::string& host;
  } listeners[] = {{"port", o.port, o.host},
                   {"http-port", o.http_port, o.host},
                   {"metrics-port", o.metrics_port, o.metrics_host}};
  for (size_t later = 1; later < std::size(listeners); ++later) {
    for (size_t earlier = 0; earlier < later; ++earlier) {
      const auto& a = listeners[earlier];
      const auto& b = listeners[later];
      if (a.port != 0 && a.port == b.port &&
          (a.host == b.host || every_address(a.host) || every_address(b.host))) {
        return FlagError(b.flag, absl::StrCat(b.port, " is --", a.flag, "'s too"));
      }
    }
  }
  if (o.http_max_connections < 0) return FlagError("http-max-connections", "must be >= 0");
  for (const std::string& origin : o.allowed_origins) {
    if (absl::Status status = CheckAllowedOrigin(origin, o.allowed_origins.size()); !status.ok()) {
      return FlagError("allowed-origins", std::string(status.message()));
    }
  }
  if (o.http_body_buffer_bytes < 0) return FlagError("http-body-buffer-bytes", "must be >= 0");
  // Durations become int milliseconds for gRPC: at most ~24 days.
  const struct {
    const char* flag;
    double value;
    double min;
  } durations[] = {
      {"max-connection-age-s", o.connections.max_connection_age_s, 0},
      {"max-connection-age-grace-s", o.connections.max_connection_age_grace_s, 0},
      {"keepalive-time-s", o.connections.keepalive_time_s, 0},
      {"keepalive-timeout-s", o.connections.keepalive_timeout_s, 0.001},
      {"keepalive-min-client-interval-s", o.connections.keepalive_min_client_interval_s, 0},
      {"stream-write-timeout-s", o.stream_write_timeout_s, 0.01},
  };
  for (const auto& d : durations) {
    if (!(d.value >= d.min && d.value <= kMaxDurationS)) {
      return FlagError(d.flag, absl::StrCat("must be in [", d.min, ", ", kMaxDurationS, "]"));
    }
  }
  if (o.kv_cache_bytes <= 0) return FlagError("kv-cache-bytes", "must be > 0");
  if (o.max_batch_tokens < 1) return FlagError("max-batch-tokens", "must be >= 1");
  if (o.max_running_requests < 1) return FlagError("max-running-requests", "must be >= 1");
  if (o.max_queue < 1) return FlagError("max-queue", "must be >= 1");
  if (o.stream_interval < 1 || o.stream_interval > 4096) {
    return FlagError("stream-interval", "must be in [1, 4096]");
  }
  if (o.max_stream_buffer_bytes < 1024) {
    return FlagError("max-stream-buffer-bytes", "must be >= 1024");
  }
  if (o.output_buffer_bytes < 0) {
    return FlagError("output-buffer-bytes", "must be >= 0");
  }
  if (o.max_request_bytes < 1024 || o.max_request_bytes > (int64_t{1} << 31) - 1) {
    return FlagError("max-request-bytes", "must be in [1024, 2^31)");
  }
  if (o.max_metadata_bytes < 1024 || o.max_metadata_bytes > (int64_t{1} << 20)) {
    return FlagError("max-metadata-bytes", "must be in [1024, 1048576]");
  }
  if (o.serving_threads_nice < 0 || o.serving_threads_nice > 19) {
    return FlagError("serving-threads-nice", "must be in [0, 19]");
  }
  if (o.debug_step_delay_ms < 0 || o.debug_step_delay_ms > 10000) {
    return FlagError("debug-step-delay-ms", "must be in [0, 10000]");
  }
  if (!(o.drain_timeout_s >= 0)) {
    return FlagError("drain-timeout-s", "must be >= 0 (inf: no limit)");
  }
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    return FlagError(o.tls.cert_file.empty() ? "tls-cert" : "tls-key",
                     "--tls-cert and --tls-key go together");
  }
  if (!o.tls.client_ca_file.empty() && !o.tls.enabled()) {
    return FlagError("tls-client-ca", "needs --tls-cert and --tls-key");
  }
  return o;
}

std::string ServedModelName(const std::string& flag_value, const ModelConfig& config,
                            const std::string& model_dir) {
  if (!flag_value.empty()) return flag_value;
  if (!config.name.empty()) return config.name;
  // The directory's own name: "." (the working directory), "dir/.." and a
  // trailing slash are resolved lexically (symbolic links are not followed).
  std::error_code error;
  std::filesystem::path dir = std::filesystem::absolute(model_dir, error);
  if (error) dir = model_dir;
  dir = dir.lexically_normal();
  if (!dir.has_filename() && dir.has_parent_path() && dir != dir.root_path()) {
    dir = dir.parent_path();  // "/m/kjv/" -> "/m/kjv"
  }
  const std::string name = dir.filename().string();
  return name.empty() ? dir.string() : name;  // the root: "/"
}

std::string HostPort(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

std::string ListenAddress(const ServerOptions& options) {
  return HostPort(options.host, options.port);
}

}  // namespace switchserve
