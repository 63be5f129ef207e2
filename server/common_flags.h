// Flags shared by several subcommands (absl flags are process-global, so each
// is defined exactly once, here).
#ifndef SWITCHSERVE_SERVER_COMMON_FLAGS_H_
#define SWITCHSERVE_SERVER_COMMON_FLAGS_H_

#include <chrono>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "engine/model/model_loader.h"
#include "kernels/backends.h"

namespace switchserve {

// --weights-dtype, --allow-non-finite-weights and --max-model-len, parsed;
// INVALID_ARGUMENT names the flag.
absl::StatusOr<ModelLoadOptions> LoadOptionsFromFlags();
// --kv-cache-dtype, parsed; INVALID_ARGUMENT names the flag.
absl::StatusOr<KvCacheDtype> KvCacheDtypeFromFlags();
// --cpu-kernels, parsed (auto: none); INVALID_ARGUMENT names the flag.
absl::StatusOr<std::optional<cpu::KernelIsa>> CpuKernelsFromFlags();

// --threads, checked: 0 (all cores) to kMaxThreads; INVALID_ARGUMENT names the
// flag. Each thread is a worker with its own scratch: 100,000 of them took
// gigabytes before the model ran.
inline constexpr int kMaxThreads = 1024;
absl::StatusOr<int> ThreadsFromFlags();

// --kv-block-size, checked: 1 to 1024 tokens; INVALID_ARGUMENT names the flag.
// The offline subcommands take it too: the CUDA backend's logits depend on
// it, so `score` reproduces a server's bits only at the server's size.
absl::StatusOr<int> KvBlockSizeFromFlags();

// Why `host` cannot be an address to listen on or dial ("not an IPv4 or IPv6
// address or a host name: ..."), or "" when it is a valid IPv4 or IPv6
// literal (brackets allowed) or a name. Text that looks like a dotted quad
// but is not one ("999.1.1.1") is refused: civetweb would read it as
// 231.1.1.1.
std::string HostProblem(const std::string& host);
// The address of an IPv6 literal (`::1` or `[::1]`), without brackets;
// nullopt for anything else.
std::optional<std::string> Ipv6Literal(const std::string& host);

}  // namespace switchserve

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, weights_dtype);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);
ABSL_DECLARE_FLAG(bool, allow_non_finite_weights);
ABSL_DECLARE_FLAG(int, max_model_len);
ABSL_DECLARE_FLAG(bool, cpu_weight_copies);
ABSL_DECLARE_FLAG(std::string, cpu_kernels);
ABSL_DECLARE_FLAG(int, kv_block_size);

namespace switchserve {

// A duration flag given in seconds (validated >= 0 and not NaN; +inf allowed)
// as milliseconds, saturating at kMaxWaitSeconds (about ten years): a
// conversion out of range would otherwise wrap to a negative wait.
inline constexpr double kMaxWaitSeconds = 3.15e8;
std::chrono::milliseconds MillisecondsFromSeconds(double seconds);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_COMMON_FLAGS_H_
