// The `switchserve serve` configuration: every flag, parsed and validated once
// into ServerOptions. The defaults live in the flag definitions
// (server_flags.cc) and nowhere else; README.md lists them.
#ifndef SWITCHSERVE_SERVER_SERVER_FLAGS_H_
#define SWITCHSERVE_SERVER_SERVER_FLAGS_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "kernels/backends.h"
#include "server/dispatch_flags.h"
#include "server/log.h"

namespace switchserve {

struct TlsOptions {
  std::string cert_file;       // PEM server certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA bundle; set: clients must present a cert (mTLS)

  bool enabled() const { return !cert_file.empty(); }
};

// gRPC connection management (GRPC_ARG_MAX_CONNECTION_AGE_MS and the
// keepalive arguments). 0 means "no limit" / "off" where the flag says so.
struct ConnectionOptions {
  // A connection older than this is told to go away (GOAWAY; gRPC adds +-10%
  // jitter) so that clients reconnect and re-resolve, and find new replicas.
  // 0: never. HTTP keep-alive connections close after their first response
  // past this age.
  double max_connection_age_s = 0;
  // After the GOAWAY, how long calls still running on the old connection may
  // take before it is closed under them. 0: no limit (they always finish).
  double max_connection_age_grace_s = 0;
  double keepalive_time_s = 0;     // ping an idle-looking client this often; 0: never
  double keepalive_timeout_s = 0;  // close the connection when a ping is unanswered this long
  // Accept client keepalive pings this often (more often: GOAWAY
  // too_many_pings), also on connections without calls.
  double keepalive_min_client_interval_s = 0;
};

struct ServerOptions {
  std::string model_dir;  // empty: DefaultModelDirectory()
  std::string host;
  int port = 0;
  int http_port = 0;  // OpenAI-compatible HTTP API; 0 disables
  // HTTP connections open at once; 0: half the open-file limit.
  int64_t http_max_connections = 0;
  // Browser origins that may call the HTTP API (CORS), or {"*"}; empty:
  // none (HttpServerOptions::allowed_origins).
  std::vector<std::string> allowed_origins;
  // HTTP request bodies held at once, all connections together; 0: a
  // quarter of the memory limit, at most 1 GiB.
  int64_t http_body_buffer_bytes = 0;
  int metrics_port = 0;      // 0 disables
  std::string metrics_host;  // the exporter's address (--host unless given)
  bool reflection = true;    // serve grpc.reflection
  bool moe_metrics = true;   // false: --no-moe-metrics (serving and process metrics only)
  DeviceKind device = DeviceKind::kCpu;
  int threads = 0;        // backend threads; 0: all cores
  ModelLoadOptions load;  // --weights-dtype, --allow-non-finite-weights
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  bool cpu_weight_copies = true;                             // BackendOptions::cpu_weight_copies
  std::optional<cpu::KernelIsa> cpu_kernels = std::nullopt;  // BackendOptions::cpu_kernels
  // KV cache budget. The cache never gets larger than max_running_requests
  // full contexts, so small models do not reserve memory they cannot use.
  int64_t kv_cache_bytes = 0;
  int kv_block_size = 0;
  int64_t max_batch_tokens = 0;
  int max_running_requests = 0;
  int max_queue = 0;
  bool prefix_caching = false;       // --enable-prefix-caching (KvCacheOptions::prefix_caching)
  bool priority_scheduling = false;  // --scheduling-policy priority (RequestLimits)
  // Streamed generations: tokens per message after the first
  // (GenerationRequest::stream_interval).
  int stream_interval = 0;
  // GenerateStream: a stream whose client stops reading is ended after its
  // write has waited this long (GenerationServiceOptions). Any stream (gRPC,
  // HTTP): ended once this much output waits for it, or once the output
  // waiting for all clients (streams, non-streamed HTTP responses) would pass
  // output_buffer_bytes (0: the default, serve_command.cc).
  double stream_write_timeout_s = 0;
  int64_t max_stream_buffer_bytes = 0;
  int64_t output_buffer_bytes = 0;
  int64_t max_request_bytes = 0;
  // Request metadata of one call, counted as HPACK does (name + value + 32
  // bytes per entry). The service refuses a call above it; the transport
  // itself accepts up to TransportMetadataLimit() and closes the whole
  // connection beyond that (gRPC 1.51), failing every call on it.
  int64_t max_metadata_bytes = 0;
  int64_t TransportMetadataLimit() const {
    return std::max<int64_t>(int64_t{1} << 20, 4 * max_metadata_bytes);
  }
  // Overrides of the model's dispatch config.
  DispatchOverrides dispatch;
  double drain_timeout_s = 0;
  TlsOptions tls;
  std::string auth_token_file;  // empty: no authentication
  ConnectionOptions connections;
  std::string served_model_name;  // empty: the model's name, else its directory's
  LogFormat log_format = LogFormat::kText;
  // Added to the nice value of every thread but the engine's compute threads
  // (server/thread_priority.h); 0: none.
  int serving_threads_nice = 0;
  // Testing aid: every engine step takes at least this long, so tests can
  // observe requests in flight (drain, cancellation) with tiny models.
  int debug_step_delay_ms = 0;
};

// Reads and validates the `serve` flags (after absl::ParseCommandLine).
// INVALID_ARGUMENT names the flag.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();

// The name clients and metrics know the model by: --served-model-name, else
// the config's `name`, else the model directory's last component.
std::string ServedModelName(const std::string& flag_value, const ModelConfig& config,
                            const std::string& model_dir);

// "host:port" as gRPC and URLs want it (an IPv6 host bracketed).
std::string HostPort(const std::string& host, int port);
// HostPort of --host and --port.
std::string ListenAddress(const ServerOptions& options);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_SERVER_FLAGS_H_
