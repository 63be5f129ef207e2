#include "server/metrics/metrics_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iterator>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/metrics/process_metrics.h"

namespace switchserve {
namespace {

bool Listening(int fd) {
  int listening = 0;
  socklen_t length = sizeof(listening);
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 && listening != 0;
}

// The process's TCP sockets whose local port is `port`: a listening socket
// bound to it and the connections that socket accepted.
std::vector<int> SocketsOnPort(int port) {
  std::vector<int> fds;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    const int fd = std::atoi(it->path().filename().c_str());
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    // Not a socket (the directory's own descriptor among them): skipped.
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    const int local_port = address.ss_family == AF_INET
                               ? ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port)
                           : address.ss_family == AF_INET6
                               ? ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port)
                               : -1;
    if (local_port == port) fds.push_back(fd);
  }
  return fds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& host, int port,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  // civetweb wants IPv6 addresses bracketed: "[::]:9090".
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  const std::string address =
      ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
  std::unique_ptr<MetricsExposer> out(new MetricsExposer());
  out->collectables_ = std::move(collectables);
  out->collectables_.push_back(std::make_shared<ProcessMetrics>());
  try {
    // civetweb throws when it cannot bind; keep exceptions inside this call.
    // Each connection holds one of its threads until its request has come:
    // with prometheus-cpp's 2 threads and civetweb's 30 s wait, two idle
    // connections kept every scrape waiting for 30 s. A scraper sends its
    // request at once.
    out->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "8", "request_timeout_ms", "2000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", e.what()));
  }
  for (const auto& collectable : out->collectables_) {
    out->exposer_->RegisterCollectable(collectable);
  }
  const std::vector<int> ports = out->exposer_->GetListeningPorts();
  out->port_ = ports.empty() ? port : ports.front();
  return out;
}

std::string MetricsExposer::Render() const {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : collectables_) {
    std::vector<prometheus::MetricFamily> collected = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

MetricsExposer::~MetricsExposer() {
  // The listening socket first, so that no connection comes after the
  // others were ended; then each connection, whose thread would otherwise
  // wait up to request_timeout_ms for a request that is not coming.
  for (const bool listening : {true, false}) {
    for (int fd : SocketsOnPort(port_)) {
      if (Listening(fd) == listening) shutdown(fd, SHUT_RDWR);
    }
  }
  exposer_.reset();
}

}  // namespace switchserve
