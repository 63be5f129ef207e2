// TLS, mutual TLS and bearer-token authentication of the real server, with
// certificates generated for the test.
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"

namespace switchserve::testing {
namespace {

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& certs,
                                          bool client_cert) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFileOrDie(certs + "/ca.pem");
  if (client_cert) {
    ssl.pem_cert_chain = ReadFileOrDie(certs + "/client.pem");
    ssl.pem_private_key = ReadFileOrDie(certs + "/client.key");
  }
  return grpc::CreateChannel(address, grpc::SslCredentials(ssl));
}

// A Tokenize call: the cheapest guarded method. `scheme` precedes the token.
grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& token = "",
                  const std::string& scheme = "Bearer ") {
  auto stub = v1::Generation::NewStub(channel);
  auto context = ContextWithDeadline(10);
  if (!token.empty()) context->AddMetadata("authorization", scheme + token);
  v1::TokenizeRequest request;
  request.set_text("hi");
  v1::TokenizeResponse response;
  return stub->Tokenize(context.get(), request, &response);
}

TEST(SecurityTest, TlsServerAcceptsTlsClientsOnly) {
  auto certs = MakeTestCertificates("tls");
  ASSERT_TRUE(certs.ok()) << certs.status();
  auto server = ServerProcess::Start(
      {"--tls-cert", *certs + "/server.pem", "--tls-key", *certs + "/server.key"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Call(TlsChannel((*server)->address(), *certs, false)).ok());
  EXPECT_EQ(Call((*server)->Channel()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(SecurityTest, MutualTlsRequiresClientCertificate) {
  auto certs = MakeTestCertificates("mtls");
  ASSERT_TRUE(certs.ok()) << certs.status();
  auto server =
      ServerProcess::Start({"--tls-cert", *certs + "/server.pem", "--tls-key",
                            *certs + "/server.key", "--tls-client-ca", *certs + "/ca.pem"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(Call(TlsChannel((*server)->address(), *certs, true)).ok());
  EXPECT_EQ(Call(TlsChannel((*server)->address(), *certs, false)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST(SecurityTest, BearerTokenGuardsGenerationButNotHealth) {
  auto certs = MakeTestCertificates("token");  // only for a place to put the token
  ASSERT_TRUE(certs.ok());
  const std::string token_file = *certs + "/token";
  std::ofstream(token_file) << "s3cret-token\n";
  auto server = ServerProcess::Start({"--auth-token-file", token_file});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(channel, "wrong-token").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(channel, "s3cret-token").ok());
  {
    auto stub = v1::Generation::NewStub(channel);
    auto context = ContextWithDeadline(30);
    v1::GenerateResponse response;
    EXPECT_EQ(stub->Generate(context.get(), TextRequest("hi", 3), &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckResponse response;
  auto context = ContextWithDeadline(10);
  ASSERT_TRUE(health->Check(context.get(), {}, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// RFC 7235: the scheme is case-insensitive.
TEST(SecurityTest, BearerSchemeIsCaseInsensitive) {
  auto certs = MakeTestCertificates("token_case");
  ASSERT_TRUE(certs.ok());
  const std::string token_file = *certs + "/token";
  std::ofstream(token_file) << "s3cret-token";
  auto server = ServerProcess::Start({"--auth-token-file", token_file});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  for (const std::string scheme : {"Bearer ", "bearer ", "BEARER ", "bEaReR  "}) {
    EXPECT_TRUE(Call(channel, "s3cret-token", scheme).ok()) << scheme;
  }
  for (const std::string scheme : {"Bearer", "Basic ", "Bearerx ", " Bearer "}) {
    EXPECT_EQ(Call(channel, "s3cret-token", scheme).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << scheme;
  }
  EXPECT_EQ(Call(channel, "S3CRET-TOKEN", "bearer ").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

// Bad TLS material and token files stop startup with a message naming the flag
// and the file, before the model is loaded.
TEST(SecurityTest, CredentialProblemsAreReportedBeforeTheModelLoads) {
  auto certs = MakeTestCertificates("bad_tls");
  ASSERT_TRUE(certs.ok()) << certs.status();
  const std::string dir = *certs;
  std::ofstream(dir + "/garbage.pem") << "not a certificate\n";
  std::string corrupt = ReadFileOrDie(dir + "/server.pem");
  corrupt[corrupt.find('\n') + 10] ^= 0x20;  // one base64 character inside the block
  corrupt[corrupt.find('\n') + 40] = '!';
  std::ofstream(dir + "/corrupt.pem") << corrupt;
  ASSERT_EQ(mkfifo((dir + "/token.fifo").c_str(), 0600), 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/client.key"},
       "--tls-key " + dir + "/client.key: gRPC refused"},
      {{"--tls-cert", dir + "/garbage.pem", "--tls-key", dir + "/server.key"},
       "--tls-cert " + dir + "/garbage.pem: no PEM certificate"},
      {{"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/garbage.pem"},
       "--tls-key " + dir + "/garbage.pem: no PEM private key"},
      {{"--tls-cert", dir + "/corrupt.pem", "--tls-key", dir + "/server.key"},
       "--tls-cert " + dir + "/corrupt.pem"},
      {{"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server.key", "--tls-client-ca",
        dir + "/garbage.pem"},
       "--tls-client-ca " + dir + "/garbage.pem: no PEM certificate"},
      {{"--tls-cert", dir + "/missing.pem", "--tls-key", dir + "/server.key"},
       "--tls-cert " + dir + "/missing.pem: not found"},
      {{"--auth-token-file", dir + "/token.fifo"}, dir + "/token.fifo: not a regular file"},
  };
  for (const auto& [args, expected] : cases) {
    auto server = ServerProcess::Start(args);
    ASSERT_FALSE(server.ok()) << expected;
    const std::string log(server.status().message());
    EXPECT_NE(log.find(expected), std::string::npos) << log;
    EXPECT_EQ(log.find("loading model"), std::string::npos) << log;
  }
}

// The parts not guarded by the bearer token can be narrowed: reflection
// switched off, the plain-HTTP metrics exporter bound to another address.
TEST(SecurityTest, ReflectionCanBeOffAndMetricsOnTheirOwnAddress) {
  const int metrics_port = FreePort("127.0.0.2");
  ASSERT_GT(metrics_port, 0);
  auto server = ServerProcess::Start({"--noreflection", "--metrics-host", "127.0.0.2",
                                      "--metrics-port", std::to_string(metrics_port)});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE(HttpGet("127.0.0.2", metrics_port, "/metrics").find("switchserve_requests_total"),
            std::string::npos);
  EXPECT_EQ(HttpGet("127.0.0.1", metrics_port, "/metrics"), "");

  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub((*server)->Channel());
  auto context = ContextWithDeadline(10);
  auto stream = reflection->ServerReflectionInfo(context.get());
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  stream->Write(request);
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(Call((*server)->Channel()).ok());  // the API itself is there
}

TEST(SecurityTest, HealthCommandSpeaksTls) {
  auto certs = MakeTestCertificates("health_tls");
  ASSERT_TRUE(certs.ok()) << certs.status();
  auto server = ServerProcess::Start(
      {"--tls-cert", *certs + "/server.pem", "--tls-key", *certs + "/server.key"});
  ASSERT_TRUE(server.ok()) << server.status();
  // 127.0.0.1 rather than localhost: c-ares name resolution leaks a few bytes,
  // which fails the command under LeakSanitizer.
  const std::string command = std::string(SWITCHSERVE_BINARY) + " health --address " +
                              (*server)->address() + " --tls-ca " + *certs +
                              "/ca.pem --tls-server-name localhost > /dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0);
  const std::string plaintext = std::string(SWITCHSERVE_BINARY) + " health --address " +
                                (*server)->address() + " --timeout-s 2 2> /dev/null";
  EXPECT_NE(std::system(plaintext.c_str()), 0);
}

}  // namespace
}  // namespace switchserve::testing
