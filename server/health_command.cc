// `switchserve health`: a grpc.health.v1 client for probes and scripts.
// Exits 0 when the server answers SERVING, 1 when it answers anything else
// (NOT_SERVING while loading or draining), 2 when it cannot be asked.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "server/auth.h"
#include "server/common_flags.h"
#include "server/server_flags.h"

ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);

ABSL_FLAG(std::string, address, "localhost:50051", "health: the server to ask, HOST:PORT");
ABSL_FLAG(bool, tls, false, "health: connect with TLS");
ABSL_FLAG(std::string, tls_ca, "",
          "health: PEM CA bundle that signed the server's certificate (default: system roots)");
ABSL_FLAG(std::string, tls_server_name, "",
          "health: name to verify in the server's certificate (default: the address host)");
ABSL_FLAG(std::string, service, "", "health: service to ask about; empty: the whole server");
ABSL_FLAG(double, timeout_s, 5, "health: deadline of the check");

namespace switchserve {
namespace {

int HealthError(const std::string& message) {
  std::fprintf(stderr, "switchserve health: %s\n", message.c_str());
  return 2;
}

// "--address: ..." when `address` is not HOST:PORT with a port in [1, 65535]
// ("[::1]:50051" for IPv6); empty when it is. gRPC would dial port 443 for a
// missing port and wrap 70000 to 4464. A gRPC target with a scheme
// ("unix:/path", "dns:///host:port") is left to gRPC.
std::string AddressProblem(const std::string& address) {
  if (address.rfind("unix:", 0) == 0 || address.find("://") != std::string::npos) return "";
  const size_t colon = address.rfind(':');
  const std::string want = " (want HOST:PORT, e.g. localhost:50051 or [::1]:50051)";
  if (colon == std::string::npos || colon == 0) {
    return absl::StrCat("--address: no port in \"", address, "\"", want);
  }
  std::string host = address.substr(0, colon);
  if (host.find(':') != std::string::npos && !(host.front() == '[' && host.back() == ']')) {
    return absl::StrCat("--address: an IPv6 address goes in brackets: \"", address, "\"", want);
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::StrCat("--address: the port must be in [1, 65535], found \"",
                        address.substr(colon + 1), "\"");
  }
  if (const std::string problem = HostProblem(host); !problem.empty()) {
    return absl::StrCat("--address: ", problem);
  }
  return "";
}

// Asks the server once. Every gRPC object of the check lives in this scope.
int CheckHealth() {
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s >= 0)) return HealthError("--timeout-s: must be >= 0");
  if (const std::string problem = AddressProblem(absl::GetFlag(FLAGS_address)); !problem.empty()) {
    return HealthError(problem);
  }

  const std::string cert_file = absl::GetFlag(FLAGS_tls_cert);
  const std::string key_file = absl::GetFlag(FLAGS_tls_key);
  const std::string ca_file = absl::GetFlag(FLAGS_tls_ca);
  const bool tls = absl::GetFlag(FLAGS_tls) || !ca_file.empty() || !cert_file.empty();
  // The same pairing with TLS off: a probe meant for mTLS must not pass over
  // plaintext.
  if (cert_file.empty() != key_file.empty()) {
    return HealthError("--tls-cert and --tls-key go together");
  }
  if (!tls && !absl::GetFlag(FLAGS_tls_server_name).empty()) {
    return HealthError("--tls-server-name needs TLS (--tls, --tls-ca or --tls-cert)");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments channel_args;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!ca_file.empty()) {
      auto ca = ReadFileToString(ca_file);
      if (!ca.ok()) return HealthError(std::string(ca.status().message()));
      ssl.pem_root_certs = *ca;
    }
    if (!cert_file.empty()) {
      auto cert = ReadFileToString(cert_file);
      if (!cert.ok()) return HealthError(std::string(cert.status().message()));
      auto key = ReadFileToString(key_file);
      if (!key.ok()) return HealthError(std::string(key.status().message()));
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
    if (const std::string name = absl::GetFlag(FLAGS_tls_server_name); !name.empty()) {
      channel_args.SetSslTargetNameOverride(name);
    }
  }
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_address), credentials, channel_args);
  auto stub = grpc::health::v1::Health::NewStub(channel);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + MillisecondsFromSeconds(timeout_s));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return HealthError(absl::GetFlag(FLAGS_address) + ": " + status.error_message());
  }
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::printf("%s\n", name.c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace

int RunHealthCommand(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);  // main() already turned --a-b into --a_b
  // gRPC releases a TLS connection on its own threads after the channel is
  // gone; a process that returned at once could exit while they still held
  // OpenSSL state. Shutting gRPC down and waiting for it exits clean.
  grpc_init();
  const int exit_code = CheckHealth();
  grpc_shutdown_blocking();
  return exit_code;
}

}  // namespace switchserve
