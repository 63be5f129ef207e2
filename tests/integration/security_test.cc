// TLS, mutual TLS and bearer-token authentication of the real server, with
// certificates generated for the test.
#include <fstream>
#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
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

// A Tokenize call: the cheapest guarded method.
grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& token = "") {
  auto stub = v1::Generation::NewStub(channel);
  auto context = ContextWithDeadline(10);
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
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

TEST(SecurityTest, HealthCommandSpeaksTls) {
  auto certs = MakeTestCertificates("health_tls");
  ASSERT_TRUE(certs.ok()) << certs.status();
  auto server = ServerProcess::Start(
      {"--tls-cert", *certs + "/server.pem", "--tls-key", *certs + "/server.key"});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string command = std::string(SWITCHSERVE_BINARY) +
                              " health --address localhost:" + std::to_string((*server)->port()) +
                              " --tls-ca " + *certs + "/ca.pem > /dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0);
  const std::string plaintext = std::string(SWITCHSERVE_BINARY) + " health --address " +
                                (*server)->address() + " --timeout-s 2 2> /dev/null";
  EXPECT_NE(std::system(plaintext.c_str()), 0);
}

}  // namespace
}  // namespace switchserve::testing
