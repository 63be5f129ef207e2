// Transport security and caller authentication of the server: TLS / mTLS
// credentials from PEM files, and the optional bearer token every Generation
// call must carry (`authorization: Bearer <token>`). Health checks and
// reflection are not guarded by the token (probes and tooling must work).
#ifndef SWITCHSERVE_SERVER_AUTH_H_
#define SWITCHSERVE_SERVER_AUTH_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "server/server_flags.h"

namespace switchserve {

// The whole file. NOT_FOUND / FAILED_PRECONDITION name the path; anything but
// a regular file (a FIFO, a directory) is refused without blocking.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Insecure credentials without TLS; with it, the certificate and key, and
// when a client CA is given, required and verified client certificates.
// Checked as gRPC will use them (bound once to a loopback port): files that
// are missing, hold no PEM, or a key that does not match the certificate are
// INVALID_ARGUMENT / NOT_FOUND naming the flag and file. Call it before the
// slow parts of startup.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls);

// Immutable after creation; Check is safe from any thread.
class BearerTokenAuth {
 public:
  // Reads the token from `path` (surrounding whitespace ignored; must not be
  // empty).
  static absl::StatusOr<std::unique_ptr<BearerTokenAuth>> FromFile(const std::string& path);
  explicit BearerTokenAuth(std::string token) : token_(std::move(token)) {}

  // OK, or UNAUTHENTICATED when the call's metadata has no or a wrong token.
  // The scheme is matched case-insensitively (`Bearer`, `bearer`, ...).
  grpc::Status Check(const grpc::CallbackServerContext& context) const;
  // The same check of an `authorization` value (an HTTP header); nullopt:
  // none was sent.
  absl::Status CheckAuthorization(std::optional<std::string_view> authorization) const;

 private:
  std::string token_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_AUTH_H_
