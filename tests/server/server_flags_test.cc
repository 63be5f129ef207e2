// `serve` flags at their extremes: values that would overflow when turned
// into integers are refused or saturate.
#include "server/server_flags.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "server/common_flags.h"
#include "server/flag_spelling.h"

ABSL_DECLARE_FLAG(double, drain_timeout_s);
ABSL_DECLARE_FLAG(std::optional<double>, capacity_factor);
ABSL_DECLARE_FLAG(int64_t, max_metadata_bytes);
ABSL_DECLARE_FLAG(int, serving_threads_nice);
ABSL_DECLARE_FLAG(int, stream_interval);
ABSL_DECLARE_FLAG(std::string, scheduling_policy);
ABSL_DECLARE_FLAG(double, stream_write_timeout_s);
ABSL_DECLARE_FLAG(int64_t, max_stream_buffer_bytes);
ABSL_DECLARE_FLAG(int64_t, http_max_connections);
ABSL_DECLARE_FLAG(std::string, allowed_origins);
ABSL_DECLARE_FLAG(int64_t, http_body_buffer_bytes);
ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(std::string, metrics_host);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(int, http_port);

namespace switchserve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(ServerFlagsTest, SecondsBecomeMillisecondsWithoutOverflow) {
  using std::chrono::milliseconds;
  EXPECT_EQ(MillisecondsFromSeconds(0.25), milliseconds(250));
  EXPECT_EQ(MillisecondsFromSeconds(0), milliseconds(0));
  const milliseconds longest(static_cast<int64_t>(kMaxWaitSeconds * 1000));
  for (double huge : {kMaxWaitSeconds * 2, 1e300, kInf}) {
    EXPECT_EQ(MillisecondsFromSeconds(huge), longest) << huge;
  }
  // Waiting that long from now stays representable on the steady clock.
  EXPECT_GT(std::chrono::steady_clock::now() + longest, std::chrono::steady_clock::now());
  EXPECT_EQ(MillisecondsFromSeconds(kNaN), milliseconds(0));
  EXPECT_EQ(MillisecondsFromSeconds(-kInf), milliseconds(0));
}

TEST(ServerFlagsTest, DrainTimeoutAcceptsInfinityRefusesNaN) {
  absl::SetFlag(&FLAGS_drain_timeout_s, kInf);
  EXPECT_TRUE(ServerOptionsFromFlags().ok());
  for (double bad : {kNaN, -1.0, -kInf}) {
    absl::SetFlag(&FLAGS_drain_timeout_s, bad);
    const auto options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--drain-timeout-s"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_drain_timeout_s, 30);
}

TEST(ServerFlagsTest, CapacityFactorMustBeFinite) {
  absl::SetFlag(&FLAGS_capacity_factor, 1e300);  // saturates in CapacityPerExpert
  EXPECT_TRUE(ServerOptionsFromFlags().ok());
  for (double bad : {kNaN, kInf, -kInf}) {
    absl::SetFlag(&FLAGS_capacity_factor, bad);
    const auto options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--capacity-factor"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_capacity_factor, std::nullopt);
}

TEST(ServerFlagsTest, ServingThreadsNiceIsZeroToNineteenTenByDefault) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->serving_threads_nice, 10);
  for (int nice : {0, 19}) {
    absl::SetFlag(&FLAGS_serving_threads_nice, nice);
    options = ServerOptionsFromFlags();
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->serving_threads_nice, nice);
  }
  for (int bad : {-1, 20}) {
    absl::SetFlag(&FLAGS_serving_threads_nice, bad);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--serving-threads-nice"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_serving_threads_nice, 10);
}

// The exporter listens on IPv4 only: an IPv6 --host gives it the IPv4
// counterpart where there is one; an IPv6 --metrics-host is refused.
TEST(ServerFlagsTest, ListenersOnOneAddressTakeDifferentPorts) {
  absl::SetFlag(&FLAGS_port, 52399);
  absl::SetFlag(&FLAGS_http_port, 52399);
  auto options = ServerOptionsFromFlags();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(options.status().message(), "--http-port: 52399 is --port's too");
  absl::SetFlag(&FLAGS_http_port, 0);  // off
  absl::SetFlag(&FLAGS_metrics_port, 52399);
  options = ServerOptionsFromFlags();
  EXPECT_EQ(options.status().message(), "--metrics-port: 52399 is --port's too");
  // The exporter on another address may take the same port, but not beside
  // a listener on every address.
  absl::SetFlag(&FLAGS_host, "127.0.0.1");
  absl::SetFlag(&FLAGS_metrics_host, "127.0.0.2");
  EXPECT_TRUE(ServerOptionsFromFlags().ok());
  absl::SetFlag(&FLAGS_metrics_host, "0.0.0.0");
  EXPECT_FALSE(ServerOptionsFromFlags().ok());
  absl::SetFlag(&FLAGS_port, 0);  // a free port, whatever the others
  absl::SetFlag(&FLAGS_metrics_port, 0);
  EXPECT_TRUE(ServerOptionsFromFlags().ok());
  absl::SetFlag(&FLAGS_port, 50051);
  absl::SetFlag(&FLAGS_metrics_port, 9090);
  absl::SetFlag(&FLAGS_host, "0.0.0.0");
  absl::SetFlag(&FLAGS_metrics_host, "");
}

TEST(ServerFlagsTest, MetricsHostIsIpv4) {
  const std::pair<const char*, const char*> inherited[] = {
      {"::", "0.0.0.0"},      {"[::]", "0.0.0.0"},        {"::1", "127.0.0.1"},
      {"[::1]", "127.0.0.1"}, {"127.0.0.2", "127.0.0.2"}, {"localhost", "localhost"}};
  for (const auto& [host, metrics_host] : inherited) {
    absl::SetFlag(&FLAGS_host, host);
    auto options = ServerOptionsFromFlags();
    ASSERT_TRUE(options.ok()) << host << ": " << options.status();
    EXPECT_EQ(options->host, host);
    EXPECT_EQ(options->metrics_host, metrics_host) << host;
  }
  absl::SetFlag(&FLAGS_host, "fe80::1");
  auto options = ServerOptionsFromFlags();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("--metrics-host"), std::string::npos);
  absl::SetFlag(&FLAGS_metrics_port, 0);  // no exporter: nothing to listen on
  EXPECT_TRUE(ServerOptionsFromFlags().ok());
  absl::SetFlag(&FLAGS_metrics_port, 9090);
  absl::SetFlag(&FLAGS_metrics_host, "10.0.0.1");
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->metrics_host, "10.0.0.1");
  absl::SetFlag(&FLAGS_host, "0.0.0.0");
  for (const char* v6 : {"::1", "[::]"}) {
    absl::SetFlag(&FLAGS_metrics_host, v6);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << v6;
    EXPECT_NE(options.status().message().find("IPv4 only"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_metrics_host, "");
}

TEST(ServerFlagsTest, StreamWriteTimeoutAndBufferLimitHaveBoundedDefaults) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->stream_write_timeout_s, 60);  // the HTTP API's write timeout
  EXPECT_EQ(options->max_stream_buffer_bytes, int64_t{4} << 20);
  for (double bad : {0.0, -1.0, kInf}) {
    absl::SetFlag(&FLAGS_stream_write_timeout_s, bad);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--stream-write-timeout-s"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_stream_write_timeout_s, 0.5);
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->stream_write_timeout_s, 0.5);
  absl::SetFlag(&FLAGS_stream_write_timeout_s, 60);
  for (int64_t bad : {int64_t{0}, int64_t{1023}}) {
    absl::SetFlag(&FLAGS_max_stream_buffer_bytes, bad);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--max-stream-buffer-bytes"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_max_stream_buffer_bytes, int64_t{4} << 20);
}

TEST(ServerFlagsTest, StreamIntervalIsOneByDefaultAndOneTo4096) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->stream_interval, 1);
  for (int interval : {1, 8, 4096}) {
    absl::SetFlag(&FLAGS_stream_interval, interval);
    options = ServerOptionsFromFlags();
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->stream_interval, interval);
  }
  for (int bad : {0, -1, 4097}) {
    absl::SetFlag(&FLAGS_stream_interval, bad);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--stream-interval"), std::string::npos);
  }
  absl::SetFlag(&FLAGS_stream_interval, 1);
}

TEST(ServerFlagsTest, SchedulingPolicyIsFcfsByDefaultOrPriority) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->priority_scheduling);
  absl::SetFlag(&FLAGS_scheduling_policy, "priority");
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->priority_scheduling);
  absl::SetFlag(&FLAGS_scheduling_policy, "lifo");
  options = ServerOptionsFromFlags();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("--scheduling-policy"), std::string::npos);
  absl::SetFlag(&FLAGS_scheduling_policy, "fcfs");
}

TEST(ServerFlagsTest, HttpMaxConnectionsIsHalfTheOpenFileLimitByDefaultAndNotNegative) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->http_max_connections, 0);  // 0: half the open-file limit
  absl::SetFlag(&FLAGS_http_max_connections, 5000);
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->http_max_connections, 5000);
  absl::SetFlag(&FLAGS_http_max_connections, -1);
  options = ServerOptionsFromFlags();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("--http-max-connections"), std::string::npos);
  absl::SetFlag(&FLAGS_http_max_connections, 0);
}

// --allowed-origins: none by default; a comma-separated list of origins
// (spaces ignored), or * alone; anything else is refused naming the flag.
TEST(ServerFlagsTest, AllowedOriginsAreOriginsOrAStarAlone) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->allowed_origins.empty());
  absl::SetFlag(&FLAGS_allowed_origins, "https://app.example.com, http://localhost:3000");
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->allowed_origins,
            (std::vector<std::string>{"https://app.example.com", "http://localhost:3000"}));
  absl::SetFlag(&FLAGS_allowed_origins, "*");
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->allowed_origins, std::vector<std::string>{"*"});
  for (const char* bad : {"*,https://a.example", "app.example.com", "https://a.example/",
                          "ftp://a.example", "https://"}) {
    absl::SetFlag(&FLAGS_allowed_origins, bad);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--allowed-origins"), std::string::npos) << bad;
  }
  absl::SetFlag(&FLAGS_allowed_origins, "");
}

TEST(ServerFlagsTest, HttpBodyBufferBytesIsDerivedByDefaultAndNotNegative) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->http_body_buffer_bytes, 0);  // 0: a quarter of memory, at most 1 GiB
  absl::SetFlag(&FLAGS_http_body_buffer_bytes, 1 << 20);
  options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->http_body_buffer_bytes, 1 << 20);
  absl::SetFlag(&FLAGS_http_body_buffer_bytes, -1);
  options = ServerOptionsFromFlags();
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("--http-body-buffer-bytes"), std::string::npos);
  absl::SetFlag(&FLAGS_http_body_buffer_bytes, 0);
}

// Flag names are typed with hyphens; values that start with '-' are not
// names (a prompt "-well-known", a file "-held-out.txt"): they were rewritten
// with underscores too.
TEST(FlagSpellingTest, OnlyFlagNamesLoseTheirHyphens) {
  std::vector<std::string> args = {
      "switchserve",      "--max-queue",     "5",           "--served-model-name",
      "-my-model",        "--kv-block-size", "-1",          "--served-model-name=-a-b",
      "--no-moe-metrics", "--noreflection",  "-not-a-flag", "--max-batch-tokens=-2",
      "--metrics-host",   "--tls-cert",      "--",          "--max-queue"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  NormalizeFlagNames(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(args, (std::vector<std::string>{
                      "switchserve", "--max_queue", "5", "--served_model_name", "-my-model",
                      "--kv_block_size", "-1", "--served_model_name=-a-b", "--no_moe_metrics",
                      "--noreflection", "-not-a-flag", "--max_batch_tokens=-2",
                      // A value that names a flag stays a value.
                      "--metrics_host", "--tls-cert", "--", "--max-queue"}));
}

TEST(ServerFlagsTest, CpuWeightCopiesAreOnByDefaultAndCanBeTurnedOff) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->cpu_weight_copies);
  absl::SetFlag(&FLAGS_cpu_weight_copies, false);
  options = ServerOptionsFromFlags();
  absl::SetFlag(&FLAGS_cpu_weight_copies, true);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->cpu_weight_copies);
}

TEST(ServerFlagsTest, CpuKernelsAreTheFastestByDefaultAndNamedBuildsAreParsed) {
  auto options = ServerOptionsFromFlags();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->cpu_kernels.has_value());
  for (cpu::KernelIsa isa : cpu::kAllKernelIsas) {
    absl::SetFlag(&FLAGS_cpu_kernels, std::string(cpu::ToString(isa)));
    options = ServerOptionsFromFlags();
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_EQ(options->cpu_kernels, isa);
  }
  for (const char* bad : {"sse", "AVX2", ""}) {
    absl::SetFlag(&FLAGS_cpu_kernels, bad);
    options = ServerOptionsFromFlags();
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(options.status().message().find("--cpu-kernels"), std::string::npos)
        << options.status();
  }
  absl::SetFlag(&FLAGS_cpu_kernels, "auto");
}

TEST(ServerFlagsTest, MetadataLimitIsBoundedAndBelowTheTransportLimit) {
  for (int64_t bytes : {int64_t{1023}, int64_t{1 << 20} + 1, int64_t{-1}}) {
    absl::SetFlag(&FLAGS_max_metadata_bytes, bytes);
    EXPECT_EQ(ServerOptionsFromFlags().status().code(), absl::StatusCode::kInvalidArgument)
        << bytes;
  }
  for (int64_t bytes : {int64_t{1024}, int64_t{16384}, int64_t{1 << 20}}) {
    absl::SetFlag(&FLAGS_max_metadata_bytes, bytes);
    const auto options = ServerOptionsFromFlags();
    ASSERT_TRUE(options.ok()) << options.status();
    // The service's check must come first, so an oversized call fails alone.
    EXPECT_GE(options->TransportMetadataLimit(), 4 * bytes);
    EXPECT_LE(options->TransportMetadataLimit(), std::numeric_limits<int>::max());
  }
  absl::SetFlag(&FLAGS_max_metadata_bytes, 16384);
}

TEST(ServerFlagsTest, ServedModelNameFallsBackToTheDirectorysName) {
  ModelConfig config;
  EXPECT_EQ(ServedModelName("flag", config, "/m/dir"), "flag");
  config.name = "from-config";
  EXPECT_EQ(ServedModelName("", config, "/m/dir"), "from-config");
  config.name.clear();
  for (const char* dir :
       {"/m/kjv", "/m/kjv/", "/m/kjv//", "kjv", "/m/kjv/.", "/m/kjv/sub/..", "/m/./kjv"}) {
    EXPECT_EQ(ServedModelName("", config, dir), "kjv") << dir;
  }
  // "." and ".." name the working directory and its parent, not themselves.
  const std::filesystem::path cwd = std::filesystem::current_path();
  ASSERT_TRUE(cwd.has_parent_path() && cwd != cwd.root_path()) << cwd;
  EXPECT_EQ(ServedModelName("", config, "."), cwd.filename().string());
  EXPECT_EQ(ServedModelName("", config, "./"), cwd.filename().string());
  if (cwd.parent_path() != cwd.root_path()) {
    EXPECT_EQ(ServedModelName("", config, ".."), cwd.parent_path().filename().string());
  }
  EXPECT_EQ(ServedModelName("", config, "/"), "/");  // the root has no other name
}

}  // namespace
}  // namespace switchserve
