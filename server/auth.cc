#include "server/auth.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"

namespace switchserve {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::FailedPreconditionError(absl::StrCat(path, ": read error"));
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  auto cert = ReadFileToString(tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadFileToString(tls.key_file);
  if (!key.ok()) return key.status();
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadFileToString(tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::unique_ptr<BearerTokenAuth>> BearerTokenAuth::FromFile(
    const std::string& path) {
  auto contents = ReadFileToString(path);
  if (!contents.ok()) return contents.status();
  std::string token(absl::StripAsciiWhitespace(*contents));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": the token is empty"));
  return std::make_unique<BearerTokenAuth>(std::move(token));
}

grpc::Status BearerTokenAuth::Check(const grpc::CallbackServerContext& context) const {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  const absl::Status status =
      CheckAuthorization(it == metadata.end() ? std::nullopt
                                              : std::optional<std::string_view>(std::string_view(
                                                    it->second.data(), it->second.size())));
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(status.message()));
}

absl::Status BearerTokenAuth::CheckAuthorization(
    std::optional<std::string_view> authorization) const {
  if (!authorization) {
    return absl::UnauthenticatedError("missing `authorization: Bearer <token>` metadata");
  }
  const std::string_view value = *authorization;
  constexpr std::string_view kScheme = "Bearer ";
  bool match = value.size() == kScheme.size() + token_.size() && value.substr(0, 7) == kScheme;
  // Compare every byte whatever the outcome, so timing does not leak a prefix.
  unsigned char diff = match ? 0 : 1;
  for (size_t i = 0; i < token_.size(); ++i) {
    const char c = kScheme.size() + i < value.size() ? value[kScheme.size() + i] : 0;
    diff |= static_cast<unsigned char>(c ^ token_[i]);
  }
  if (diff != 0) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

}  // namespace switchserve
