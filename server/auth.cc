#include "server/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace switchserve {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  // O_NONBLOCK: a FIFO must be refused, not waited on for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": not found"));
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  std::string contents;
  char buffer[8192];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, ": read error"));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return contents;
}

namespace {

// `flag FILE` read, holding at least one PEM block that begins with `begin`
// and ends with `end` (INVALID_ARGUMENT naming the flag and file otherwise).
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path,
                                    std::string_view begin, std::string_view end,
                                    const char* what) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--", flag, " ", text.status().message()));
  }
  const size_t at = text->find(begin);
  if (at == std::string::npos || text->find(end, at) == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": no PEM ", what, " in the file"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  auto cert = ReadPem("tls-cert", tls.cert_file, "-----BEGIN CERTIFICATE-----",
                      "-----END CERTIFICATE-----", "certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("tls-key", tls.key_file, "-----BEGIN ", " PRIVATE KEY-----", "private key");
  if (!key.ok()) return key.status();
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadPem("tls-client-ca", tls.client_ca_file, "-----BEGIN CERTIFICATE-----",
                      "-----END CERTIFICATE-----", "certificate");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  // gRPC parses the PEM and matches the key to the certificate only when a
  // port is bound: try it on a loopback port of the kernel's choosing, so a
  // bad pair is reported now, naming the files, not as "cannot listen" once
  // the model has loaded.
  grpc::ServerBuilder probe;
  int port = 0;
  probe.AddListeningPort("127.0.0.1:0", credentials, &port);
  std::unique_ptr<grpc::Server> server = probe.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert ", tls.cert_file, ", --tls-key ", tls.key_file,
        tls.client_ca_file.empty() ? "" : absl::StrCat(", --tls-client-ca ", tls.client_ca_file),
        ": gRPC refused these credentials (a key that does not match the certificate, or PEM "
        "it cannot parse)"));
  }
  server->Shutdown(std::chrono::system_clock::now());
  return credentials;
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
  // `Bearer <token>`: the scheme is case-insensitive (RFC 7235 section 2.1),
  // followed by one or more spaces.
  constexpr std::string_view kScheme = "bearer";
  size_t start = kScheme.size();
  bool match = value.size() > kScheme.size() && value[kScheme.size()] == ' ';
  for (size_t i = 0; match && i < kScheme.size(); ++i) {
    match = absl::ascii_tolower(static_cast<unsigned char>(value[i])) == kScheme[i];
  }
  while (start < value.size() && value[start] == ' ') ++start;
  const std::string_view credentials = match ? value.substr(start) : std::string_view();
  match = match && credentials.size() == token_.size();
  // Compare every byte whatever the outcome, so timing does not leak a prefix.
  unsigned char diff = match ? 0 : 1;
  for (size_t i = 0; i < token_.size(); ++i) {
    const char c = i < credentials.size() ? credentials[i] : 0;
    diff |= static_cast<unsigned char>(c ^ token_[i]);
  }
  if (diff != 0) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

}  // namespace switchserve
