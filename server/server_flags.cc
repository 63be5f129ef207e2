#include "server/server_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "server/common_flags.h"

// The defaults of every `serve` flag live here, as literals (deployment
// tooling reads them from this file: tests/deploy/server_facts.py).
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 picks a free port (logged)");
ABSL_FLAG(int, metrics_port, 9090, "Prometheus metrics port (/metrics); 0 disables");
ABSL_FLAG(std::string, metrics_host, "",
          "Address the metrics exporter listens on (plain HTTP, no TLS or token); empty: --host");
ABSL_FLAG(bool, reflection, true,
          "Serve gRPC reflection (not guarded by the bearer token); --noreflection turns it off");
ABSL_FLAG(bool, no_moe_metrics, false,
          "Export no MoE routing metrics (serving and process metrics only)");
ABSL_FLAG(int64_t, kv_cache_bytes, 1073741824,
          "KV cache budget in bytes (capped at max_running_requests full contexts)");
ABSL_FLAG(int, kv_block_size, 16, "Tokens per KV cache block");
ABSL_FLAG(int64_t, max_batch_tokens, 2048,
          "Tokens computed per engine step (decode tokens + prefill chunks)");
ABSL_FLAG(int, max_running_requests, 64, "Requests in the running batch at once");
ABSL_FLAG(int, max_queue, 1024,
          "Requests waiting for admission; beyond it calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_request_bytes, 4194304,
          "Largest request message gRPC accepts (RESOURCE_EXHAUSTED beyond)");
ABSL_FLAG(int64_t, max_metadata_bytes, 16384,
          "Largest request metadata (headers) of a call; more is RESOURCE_EXHAUSTED for that call");
ABSL_FLAG(std::optional<double>, capacity_factor, std::nullopt,
          "Expert capacity factor; <= 0 dropless; unset: the model's");
ABSL_FLAG(std::string, overflow, "", "drop | reroute; unset: the model's");
ABSL_FLAG(std::optional<int>, min_capacity, std::nullopt,
          "Minimum slots per expert per step; unset: the model's");
ABSL_FLAG(double, drain_timeout_s, 30,
          "On SIGTERM/SIGINT, how long running calls may take to finish");
// --model, --device and --threads are shared with the offline subcommands
// (server/common_flags.h).
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: the server's, enables TLS (serve); the client's, for mTLS "
          "(health)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; clients must present a certificate it signed (mTLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token every Generation call must carry");
ABSL_FLAG(int, debug_step_delay_ms, 0,
          "Testing aid: sleep this long in every engine step (0: off)");

namespace switchserve {
namespace {

absl::Status FlagError(const char* flag, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

}  // namespace

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (o.metrics_host.empty()) o.metrics_host = o.host;
  o.reflection = absl::GetFlag(FLAGS_reflection);
  o.moe_metrics = !absl::GetFlag(FLAGS_no_moe_metrics);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.allow_non_finite_weights = absl::GetFlag(FLAGS_allow_non_finite_weights);
  o.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  o.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.max_running_requests = absl::GetFlag(FLAGS_max_running_requests);
  o.max_queue = absl::GetFlag(FLAGS_max_queue);
  o.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  o.max_metadata_bytes = absl::GetFlag(FLAGS_max_metadata_bytes);
  o.capacity_factor = absl::GetFlag(FLAGS_capacity_factor);
  o.min_capacity = absl::GetFlag(FLAGS_min_capacity);
  o.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  o.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.debug_step_delay_ms = absl::GetFlag(FLAGS_debug_step_delay_ms);

  auto device = ParseDeviceKind(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return FlagError("device", std::string(device.status().message()));
  o.device = *device;
  if (const std::string overflow = absl::GetFlag(FLAGS_overflow); !overflow.empty()) {
    auto policy = ParseOverflowPolicy(overflow);
    if (!policy.ok()) return FlagError("overflow", std::string(policy.status().message()));
    o.overflow = *policy;
  }

  if (o.host.empty()) return FlagError("host", "must not be empty");
  if (o.port < 0 || o.port > 65535) return FlagError("port", "must be in [0, 65535]");
  if (o.metrics_port < 0 || o.metrics_port > 65535) {
    return FlagError("metrics-port", "must be in [0, 65535]");
  }
  if (o.threads < 0) return FlagError("threads", "must be >= 0");
  if (o.kv_cache_bytes <= 0) return FlagError("kv-cache-bytes", "must be > 0");
  if (o.kv_block_size < 1 || o.kv_block_size > 1024) {
    return FlagError("kv-block-size", "must be in [1, 1024]");
  }
  if (o.max_batch_tokens < 1) return FlagError("max-batch-tokens", "must be >= 1");
  if (o.max_running_requests < 1) return FlagError("max-running-requests", "must be >= 1");
  if (o.max_queue < 1) return FlagError("max-queue", "must be >= 1");
  if (o.max_request_bytes < 1024 || o.max_request_bytes > (int64_t{1} << 31) - 1) {
    return FlagError("max-request-bytes", "must be in [1024, 2^31)");
  }
  if (o.max_metadata_bytes < 1024 || o.max_metadata_bytes > (int64_t{1} << 20)) {
    return FlagError("max-metadata-bytes", "must be in [1024, 1048576]");
  }
  if (o.min_capacity && *o.min_capacity < 0) return FlagError("min-capacity", "must be >= 0");
  if (o.debug_step_delay_ms < 0 || o.debug_step_delay_ms > 10000) {
    return FlagError("debug-step-delay-ms", "must be in [0, 10000]");
  }
  if (!(o.drain_timeout_s >= 0)) {
    return FlagError("drain-timeout-s", "must be >= 0 (inf: no limit)");
  }
  if (o.capacity_factor && !std::isfinite(*o.capacity_factor)) {
    return FlagError("capacity-factor", "must be a finite number (<= 0: dropless)");
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

std::string ListenAddress(const ServerOptions& options) {
  const bool ipv6 = options.host.find(':') != std::string::npos && options.host.front() != '[';
  return ipv6 ? absl::StrCat("[", options.host, "]:", options.port)
              : absl::StrCat(options.host, ":", options.port);
}

}  // namespace switchserve
