#include "server/common_flags.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, model, "", "model directory (default: the built-in model)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | auto");
ABSL_FLAG(int, threads, 0, "CPU threads for the engine (0: all cores)");
ABSL_FLAG(std::string, weights_dtype, "auto",
          "auto (as model.safetensors stores them) | f32 | bf16 | f16: the dtype the weight "
          "matrices are held and computed from");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto (as the weights imply; CPU: bf16 with bf16 weight matrices, f32 with f32 or f16 "
          "ones; CUDA: bf16, or f32 with f32 weights) | f32 | bf16: the element type of the KV "
          "cache (bf16 halves its bytes per token)");
ABSL_FLAG(bool, cpu_weight_copies, true,
          "CPU backend: keep tiled copies of the weight matrices for batch-1 decode (one-row "
          "products stream them faster: 1.1-1.4x batch-1 tokens/s with bf16 weights, "
          "docs/performance.md), for about "
          "those matrices' bytes again in memory (nearly all of a bf16 model's), made only where "
          "they fit beside the weights and the KV cache in 90% of the host's memory (else left "
          "out, with a warning); --cpu-weight-copies=false never makes them. Same logits either "
          "way");
ABSL_FLAG(std::string, cpu_kernels, "auto",
          "CPU backend: auto (the fastest build this CPU runs) | avx512 | avx2 | generic: the "
          "instruction set of the matrix kernels. avx512 and avx2 give the same logits; generic "
          "(no fused multiply-add) rounds differently, on every x86-64 CPU alike. A build this "
          "CPU cannot run is refused at startup");
ABSL_FLAG(int, kv_block_size, 16,
          "tokens per KV cache block (the CUDA backend's attention takes keys a block at a time)");
ABSL_FLAG(int, max_model_len, 0,
          "the context length served: prompt + generated tokens of a request at most this many "
          "(0: the model's max_seq_len; more than that is refused). A shorter context reserves "
          "less KV cache per request (vLLM's --max-model-len)");
ABSL_FLAG(bool, allow_non_finite_weights, false,
          "Load weights holding NaN or infinity (with a warning) instead of refusing the model; "
          "also finite f32 weights the CUDA backend's 16-bit matrices make infinite");

namespace switchserve {

absl::StatusOr<ModelLoadOptions> LoadOptionsFromFlags() {
  absl::StatusOr<WeightsDtype> dtype = ParseWeightsDtype(absl::GetFlag(FLAGS_weights_dtype));
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--weights-dtype: ", dtype.status().message()));
  }
  ModelLoadOptions options;
  options.weights_dtype = *dtype;
  options.allow_non_finite_weights = absl::GetFlag(FLAGS_allow_non_finite_weights);
  const int max_model_len = absl::GetFlag(FLAGS_max_model_len);
  if (max_model_len != 0 && max_model_len < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len: must be 0 (the model's context) or at least 2, found ", max_model_len));
  }
  options.max_seq_len = max_model_len;
  return options;
}

absl::StatusOr<KvCacheDtype> KvCacheDtypeFromFlags() {
  absl::StatusOr<KvCacheDtype> dtype = ParseKvCacheDtype(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: ", dtype.status().message()));
  }
  return *dtype;
}

absl::StatusOr<std::optional<cpu::KernelIsa>> CpuKernelsFromFlags() {
  const std::string text = absl::GetFlag(FLAGS_cpu_kernels);
  if (text == "auto") return std::nullopt;
  absl::StatusOr<cpu::KernelIsa> isa = cpu::ParseKernelIsa(text);
  if (!isa.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-kernels: ", isa.status().message(), " (or auto)"));
  }
  return *isa;
}

absl::StatusOr<int> ThreadsFromFlags() {
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0 || threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads: must be in [0, ", kMaxThreads,
                                                   "] (0: all cores), found ", threads));
  }
  return threads;
}

absl::StatusOr<int> KvBlockSizeFromFlags() {
  const int size = absl::GetFlag(FLAGS_kv_block_size);
  if (size < 1 || size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-block-size: must be in [1, 1024], found ", size));
  }
  return size;
}

namespace {

bool IsHostAddressOrName(const std::string& host) {
  if (host.empty()) return false;
  unsigned char address[16];
  if (host.find(':') != std::string::npos) return Ipv6Literal(host).has_value();
  if (host.find_first_not_of("0123456789.") == std::string::npos) {
    return inet_pton(AF_INET, host.c_str(), address) == 1;
  }
  // A name: letters, digits, hyphens and dots (RFC 1123).
  return host.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") ==
         std::string::npos;
}

}  // namespace

std::optional<std::string> Ipv6Literal(const std::string& host) {
  if (host.find(':') == std::string::npos) return std::nullopt;
  std::string literal = host;
  if (literal.size() >= 2 && literal.front() == '[' && literal.back() == ']') {
    literal = literal.substr(1, literal.size() - 2);
  }
  unsigned char address[16];
  if (inet_pton(AF_INET6, literal.c_str(), address) != 1) return std::nullopt;
  return literal;
}

std::string HostProblem(const std::string& host) {
  if (IsHostAddressOrName(host)) return "";
  return absl::StrCat("not an IPv4 or IPv6 address or a host name: \"", host, "\"");
}

std::chrono::milliseconds MillisecondsFromSeconds(double seconds) {
  // NaN compares false: it becomes 0, like a negative value.
  const double clamped = seconds > 0 ? std::min(seconds, kMaxWaitSeconds) : 0.0;
  return std::chrono::milliseconds(static_cast<int64_t>(clamped * 1000.0));
}

}  // namespace switchserve
