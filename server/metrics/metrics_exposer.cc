#include "server/metrics/metrics_exposer.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/metrics/process_metrics.h"

namespace switchserve {

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

}  // namespace switchserve
