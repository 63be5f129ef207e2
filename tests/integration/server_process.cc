#include "tests/integration/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace switchserve::testing {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base ? base : "/tmp") /
                              ("switchserve_it_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The port of the "listening on 127.0.0.1:PORT" log line, or 0. (No
// std::regex: GCC 12 warns inside it under the sanitizers.)
int ListeningPort(const std::string& log) {
  constexpr std::string_view kPrefix = "listening on 127.0.0.1:";
  const size_t at = log.find(kPrefix);
  if (at == std::string::npos) return 0;
  int port = 0;
  for (size_t i = at + kPrefix.size(); i < log.size() && log[i] >= '0' && log[i] <= '9'; ++i) {
    port = port * 10 + (log[i] - '0');
  }
  return port;
}

}  // namespace

std::string TestModelDir() {
  return std::string(SWITCHSERVE_SOURCE_DIR) + "/tests/golden/switchall_f16";
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) std::abort();
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& extra_args) {
  static int counter = 0;
  auto server = std::unique_ptr<ServerProcess>(new ServerProcess());
  server->log_path_ = TempDir("server" + std::to_string(counter++)) + "/server.log";

  std::vector<std::string> args = {SWITCHSERVE_BINARY, "serve",     "--model",   TestModelDir(),
                                   "--host",           "127.0.0.1", "--port",    "0",
                                   "--metrics-port",   "0",         "--threads", "1"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    std::FILE* log = std::fopen(server->log_path_.c_str(), "w");
    if (log == nullptr) _exit(127);
    dup2(fileno(log), STDOUT_FILENO);
    dup2(fileno(log), STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  server->pid_ = pid;

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string log = server->Log();
    if (const int port = ListeningPort(log); port > 0) {
      server->port_ = port;
      return server;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      server->exited_ = true;
      return absl::InternalError(absl::StrCat("the server exited during startup:\n", log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no listening address after 120 s:\n", server->Log()));
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::shared_ptr<grpc::Channel> ServerProcess::Channel() const {
  return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
}

void ServerProcess::Signal(int signal) { kill(pid_, signal); }

int ServerProcess::WaitForExit(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

absl::StatusOr<std::string> MakeTestCertificates(const std::string& name) {
  const std::string dir = TempDir(name);
  const std::string command =
      absl::StrCat(SWITCHSERVE_SOURCE_DIR, "/tests/integration/make_test_certs.sh ", dir);
  if (std::system(command.c_str()) != 0) return absl::InternalError("make_test_certs.sh failed");
  return dir;
}

int FreePort(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &address.sin_addr);
  socklen_t length = sizeof address;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

std::string HttpGet(const std::string& host, int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &address.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[8192];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof buffer)) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

double MetricValue(const std::string& exposition, const std::string& series) {
  const std::string prefix = "\n" + series + " ";
  const size_t at = exposition.find(prefix);
  if (at == std::string::npos) return -1;
  return std::strtod(exposition.c_str() + at + prefix.size(), nullptr);
}

int64_t ResidentKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

}  // namespace switchserve::testing
