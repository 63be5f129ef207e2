#include "server/metrics/metrics_exposer.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace switchserve {

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  const std::string address = absl::StrCat(host, ":", port);
  std::unique_ptr<MetricsExposer> out(new MetricsExposer());
  out->registry_ = std::move(registry);
  out->process_ = std::make_shared<ProcessMetrics>();
  try {
    // civetweb throws when it cannot bind; keep exceptions inside this call.
    out->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", e.what()));
  }
  out->exposer_->RegisterCollectable(out->registry_);
  out->exposer_->RegisterCollectable(out->process_);
  const std::vector<int> ports = out->exposer_->GetListeningPorts();
  out->port_ = ports.empty() ? port : ports.front();
  return out;
}

}  // namespace switchserve
