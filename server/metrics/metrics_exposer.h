// The HTTP endpoint Prometheus scrapes: prometheus-cpp's pull exposer serving
// the metric collectables and the process_* metrics at http://<host>:<port>/metrics.
//
// The exposer runs its own threads (civetweb); a scrape serialises the
// registry there, never on the engine or gRPC threads.
#ifndef SWITCHSERVE_SERVER_METRICS_METRICS_EXPOSER_H_
#define SWITCHSERVE_SERVER_METRICS_METRICS_EXPOSER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace switchserve {

class MetricsExposer {
 public:
  // Binds `host`:`port` (port 0: any free port) and serves every one of
  // `collectables` (a prometheus::Registry, MoeMetrics, ...) and the process
  // metrics, which it keeps alive. UNAVAILABLE naming the address when it
  // cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(
      const std::string& host, int port,
      std::vector<std::shared_ptr<prometheus::Collectable>> collectables);

  // Stops serving at once. civetweb's listening thread polls for
  // connections 2 s at a time and sees that it should stop only between
  // polls, and a thread reading a connection waits for its request up to
  // request_timeout_ms; so the listening socket and then every connection
  // on the port are shut down first, which ends those waits (otherwise a
  // shutdown took up to 2 s more).
  ~MetricsExposer();

  // The port actually bound.
  int port() const { return port_; }

  // The series a scrape of the port returns, in the Prometheus text format,
  // less prometheus-cpp's own exposer_* series: what the HTTP API serves at
  // its /metrics. Thread-safe.
  std::string Render() const;

 private:
  MetricsExposer() = default;

  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_METRICS_EXPOSER_H_
