// Reads metric values back from a prometheus-cpp registry (or any
// Collectable) for the metrics tests, through Collect(): what the exposer
// serialises on a scrape.
#ifndef SWITCHSERVE_TESTS_METRICS_REGISTRY_READER_H_
#define SWITCHSERVE_TESTS_METRICS_REGISTRY_READER_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace switchserve::testing {

using LabelMap = std::map<std::string, std::string>;

class RegistryReader {
 public:
  explicit RegistryReader(const prometheus::Collectable& collectable)
      : families_(collectable.Collect()) {}

  // The family named `name`, or null.
  const prometheus::MetricFamily* Family(const std::string& name) const {
    for (const auto& family : families_) {
      if (family.name == name) return &family;
    }
    return nullptr;
  }

  // The series of `name` whose labels are exactly `labels`, or null.
  const prometheus::ClientMetric* Series(const std::string& name, const LabelMap& labels) const {
    const prometheus::MetricFamily* family = Family(name);
    if (family == nullptr) return nullptr;
    for (const auto& metric : family->metric) {
      LabelMap have;
      for (const auto& label : metric.label) have[label.name] = label.value;
      if (have == labels) return &metric;
    }
    return nullptr;
  }

  std::optional<double> Counter(const std::string& name, const LabelMap& labels) const {
    const auto* metric = Series(name, labels);
    if (metric == nullptr) return std::nullopt;
    return metric->counter.value;
  }

  std::optional<double> Gauge(const std::string& name, const LabelMap& labels) const {
    const auto* metric = Series(name, labels);
    if (metric == nullptr) return std::nullopt;
    return metric->gauge.value;
  }

  // Number of series `name` has in the exposition format: one per metric,
  // and for a histogram one per bucket plus _sum and _count.
  size_t ExposedSeries(const std::string& name) const {
    const prometheus::MetricFamily* family = Family(name);
    if (family == nullptr) return 0;
    size_t n = 0;
    for (const auto& metric : family->metric) {
      n += family->type == prometheus::MetricType::Histogram ? metric.histogram.bucket.size() + 2
                                                             : 1;
    }
    return n;
  }

  size_t AllExposedSeries() const {
    size_t n = 0;
    for (const auto& family : families_) n += ExposedSeries(family.name);
    return n;
  }

  const std::vector<prometheus::MetricFamily>& families() const { return families_; }

 private:
  std::vector<prometheus::MetricFamily> families_;
};

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_METRICS_REGISTRY_READER_H_
