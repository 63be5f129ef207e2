// The `switchserve serve` configuration: every flag, parsed and validated once
// into ServerOptions. The defaults live in the ServerOptions initialisers (and
// nowhere else); the flag definitions read them from there.
#ifndef SWITCHSERVE_SERVER_SERVER_FLAGS_H_
#define SWITCHSERVE_SERVER_SERVER_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace switchserve {

enum class DeviceKind { kCpu, kCuda, kAuto };

struct TlsOptions {
  std::string cert_file;       // PEM server certificate chain
  std::string key_file;        // PEM private key
  std::string client_ca_file;  // PEM CA bundle; set: clients must present a cert (mTLS)

  bool enabled() const { return !cert_file.empty(); }
};

struct ServerOptions {
  std::string model_dir;  // empty: DefaultModelDirectory()
  std::string host = "0.0.0.0";
  int port = 50051;
  int metrics_port = 9090;  // 0 disables
  bool moe_metrics = true;  // --no-moe-metrics: serving and process metrics only
  DeviceKind device = DeviceKind::kCpu;
  int threads = 0;  // backend threads; 0: all cores
  // KV cache budget. The cache never gets larger than max_running_requests
  // full contexts, so small models do not reserve memory they cannot use.
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int kv_block_size = 16;
  int64_t max_batch_tokens = 2048;
  int max_running_requests = 64;
  int max_queue = 1024;
  int64_t max_request_bytes = int64_t{4} << 20;
  // Overrides of the model's dispatch config; unset: the model's value.
  std::optional<double> capacity_factor;
  std::optional<OverflowPolicy> overflow;
  std::optional<int> min_capacity;
  double drain_timeout_s = 30;
  TlsOptions tls;
  std::string auth_token_file;  // empty: no authentication
};

// Reads and validates the `serve` flags (after absl::ParseCommandLine).
// INVALID_ARGUMENT names the flag.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();

// The flags are documented with hyphens (--kv-cache-bytes); absl spells them
// with underscores. Returns argv with every flag name's hyphens turned into
// underscores (values untouched, nothing after a bare "--"), for
// absl::ParseCommandLine. The strings live in `*storage`.
std::vector<char*> NormalizeFlagSpelling(int argc, char** argv, std::vector<std::string>* storage);

// "host:port" as gRPC wants it (IPv6 hosts bracketed).
std::string ListenAddress(const ServerOptions& options);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_SERVER_FLAGS_H_
