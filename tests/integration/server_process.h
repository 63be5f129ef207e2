// Runs the real `switchserve serve` binary for integration tests: on
// 127.0.0.1 with --port 0 (the kernel picks a free port, the test reads it from
// the startup log), a tiny golden model, and bounded waits everywhere.
#ifndef SWITCHSERVE_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define SWITCHSERVE_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace switchserve::testing {

// The model the integration tests serve (tests/golden/...).
std::string TestModelDir();

class ServerProcess {
 public:
  // Starts the server with `extra_args` after the defaults and waits (up to
  // 120 s) until it logs its listening address.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& extra_args = {});
  ~ServerProcess();  // SIGKILL if still running

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string Log() const;
  // A plaintext channel to the server.
  std::shared_ptr<grpc::Channel> Channel() const;

  // Sends `signal`, without waiting.
  void Signal(int signal);
  // Waits up to `timeout_s` for the process to exit; its exit code, or -1
  // (killed by a signal or still running after the timeout).
  int WaitForExit(double timeout_s);

 private:
  ServerProcess() = default;

  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
  bool exited_ = false;
};

// Writes test certificates (make_test_certs.sh) into a fresh directory and
// returns it: ca.pem, server.pem/.key, client.pem/.key.
absl::StatusOr<std::string> MakeTestCertificates(const std::string& name);

std::string ReadFileOrDie(const std::string& path);

// A TCP port free on `host` (an IPv4 address) right now; 0 on failure.
int FreePort(const std::string& host);

// GET http://host:port/path (HTTP/1.0): the whole response, headers
// included; "" when nothing listens there.
std::string HttpGet(const std::string& host, int port, const std::string& path);

// The value of the sample `series` (e.g. `switchserve_requests_total{status="OK"}`)
// in a Prometheus text exposition; -1 when absent.
double MetricValue(const std::string& exposition, const std::string& series);

// The resident set size of process `pid` in KiB (VmRSS), or -1.
int64_t ResidentKib(pid_t pid);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_INTEGRATION_SERVER_PROCESS_H_
