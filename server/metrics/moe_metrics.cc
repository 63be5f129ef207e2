#include "server/metrics/moe_metrics.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "prometheus/family.h"

namespace switchserve {
namespace {

// A step's probability sum as the counters and the window add it: a router
// that produced NaN or infinite probabilities (a model that overflows) adds
// nothing, or one such step would leave the counter, and every rate and aux
// loss computed from it, NaN until the server restarts.
double FiniteOrZero(double sum) { return std::isfinite(sum) ? sum : 0.0; }

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Labels;

Family<Counter>& CounterFamily(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

Family<Gauge>& GaugeFamily(prometheus::Registry& registry, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

Labels RouterLabels(const RouterId& id) {
  return {{"layer", std::to_string(id.layer)},
          {"module", std::string(ToString(id.module))},
          {"head", std::to_string(id.head)}};
}

}  // namespace

void MoeMetrics::FlatTotals::Resize(size_t routers, size_t experts) {
  tokens.assign(routers, 0);
  routed.assign(experts, 0);
  dropped.assign(experts, 0);
  rerouted.assign(experts, 0);
  prob_sum.assign(experts, 0.0);
}

void MoeMetrics::FlatTotals::Zero() {
  std::fill(tokens.begin(), tokens.end(), 0);
  std::fill(routed.begin(), routed.end(), 0);
  std::fill(dropped.begin(), dropped.end(), 0);
  std::fill(rerouted.begin(), rerouted.end(), 0);
  std::fill(prob_sum.begin(), prob_sum.end(), 0.0);
}

MoeMetrics::MoeMetrics(std::vector<RouterId> routers, MoeMetricsOptions options)
    : routers_(std::move(routers)), options_(options) {
  options_.window_steps = std::max(1, options_.window_steps);
  prometheus::Registry& registry = registry_;
  auto& assignments = CounterFamily(
      registry, "switchserve_moe_assignments_total",
      "Token-to-expert assignments chosen by the router's top-k, before capacity is applied.");
  auto& dropped =
      CounterFamily(registry, "switchserve_moe_dropped_total",
                    "Assignments routed to the expert and dropped because it was full.");
  auto& rerouted = CounterFamily(
      registry, "switchserve_moe_rerouted_total",
      "Assignments routed to the expert and moved to another one because it was full.");
  auto& prob_sum =
      CounterFamily(registry, "switchserve_moe_gate_probability_sum_total",
                    "Sum over routed tokens of the normalised gate probability P(expert | token).");
  auto& tokens = CounterFamily(registry, "switchserve_moe_router_tokens_total",
                               "Tokens the router routed (T summed over steps).");
  auto& aux_loss = GaugeFamily(
      registry, "switchserve_moe_aux_loss",
      "Load-balancing loss E * sum_e f_e * P_e over the recent window (1 = balanced, E/k = "
      "every token on the same k experts).");
  auto& load_cv = GaugeFamily(registry, "switchserve_moe_load_cv",
                              "Coefficient of variation of routed assignments per expert over "
                              "the recent window.");
  auto& dead_ratio = GaugeFamily(registry, "switchserve_moe_dead_experts_ratio",
                                 "Share of the router's experts that received no assignment in "
                                 "the recent window.");
  auto& entropy = GaugeFamily(registry, "switchserve_moe_routing_entropy",
                              "Entropy (nats) of the assignment shares over the recent window.");
  auto& max_util = GaugeFamily(registry, "switchserve_moe_max_utilization",
                               "Largest expert load over its balanced share T*k/E over the "
                               "recent window (1 = balanced).");

  series_.resize(routers_.size());
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterId& id = routers_[r];
    RouterSeries& s = series_[r];
    const Labels labels = RouterLabels(id);
    s.tokens = &tokens.Add(labels);
    s.aux_loss = &aux_loss.Add(labels);
    s.load_cv = &load_cv.Add(labels);
    s.dead_ratio = &dead_ratio.Add(labels);
    s.entropy = &entropy.Add(labels);
    s.max_utilization = &max_util.Add(labels);
    s.expert_offset = total_experts_;
    total_experts_ += id.n_experts;
    for (int e = 0; e < id.n_experts; ++e) {
      Labels expert_labels = labels;
      expert_labels.emplace("expert", std::to_string(e));
      s.assignments.push_back(&assignments.Add(expert_labels));
      s.dropped.push_back(&dropped.Add(expert_labels));
      s.rerouted.push_back(&rerouted.Add(expert_labels));
      s.prob_sum.push_back(&prob_sum.Add(expert_labels));
    }
  }
  for (FlatTotals* totals : {&pending_, &window_, &publish_delta_, &publish_window_}) {
    totals->Resize(routers_.size(), total_experts_);
  }
  ring_.resize(options_.window_steps);
  for (FlatTotals& slot : ring_) slot.Resize(routers_.size(), total_experts_);
}

absl::Status MoeMetrics::Validate(const StepRoutingStats& step) const {
  if (step.routers.size() != routers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MoeMetrics::RecordStep: step has %d routers, the model has %d",
                        step.routers.size(), routers_.size()));
  }
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterStepStats& s = step.routers[r];
    const size_t e = routers_[r].n_experts;
    if (s.routed.size() != e || s.dropped.size() != e || s.rerouted.size() != e ||
        s.prob_sum.size() != e) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MoeMetrics::RecordStep: router %d (layer %d %s head %d) has %d "
                          "experts in the step, %d in the model",
                          r, routers_[r].layer, ToString(routers_[r].module), routers_[r].head,
                          s.routed.size(), e));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeMetrics::RecordStep(const StepRoutingStats& step) {
  if (step.routers.empty()) return absl::OkStatus();
  if (absl::Status status = Validate(step); !status.ok()) return status;
  bool any_tokens = false;
  for (const RouterStepStats& s : step.routers) any_tokens = any_tokens || s.tokens > 0;
  if (!any_tokens) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mutex_);
  AddToPending(step);
  AdvanceWindow(step);
  return absl::OkStatus();
}

void MoeMetrics::AddToPending(const StepRoutingStats& step) {
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterStepStats& s = step.routers[r];
    pending_.tokens[r] += s.tokens;
    const int base = series_[r].expert_offset;
    for (int e = 0; e < routers_[r].n_experts; ++e) {
      pending_.routed[base + e] += s.routed[e];
      pending_.dropped[base + e] += s.dropped[e];
      pending_.rerouted[base + e] += s.rerouted[e];
      pending_.prob_sum[base + e] += FiniteOrZero(s.prob_sum[e]);
    }
  }
}

void MoeMetrics::AdvanceWindow(const StepRoutingStats& step) {
  FlatTotals& slot = ring_[ring_next_];
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterStepStats& s = step.routers[r];
    window_.tokens[r] += s.tokens - slot.tokens[r];
    slot.tokens[r] = s.tokens;
    const int base = series_[r].expert_offset;
    for (int e = 0; e < routers_[r].n_experts; ++e) {
      const int i = base + e;
      window_.routed[i] += s.routed[e] - slot.routed[i];
      slot.routed[i] = s.routed[e];
      const double prob_sum = FiniteOrZero(s.prob_sum[e]);
      window_.prob_sum[i] += prob_sum - slot.prob_sum[i];
      slot.prob_sum[i] = prob_sum;
    }
  }
  ring_next_ = (ring_next_ + 1) % options_.window_steps;
  ring_filled_ = std::min(ring_filled_ + 1, options_.window_steps);
  window_changed_ = true;
  if (ring_next_ == 0) {
    // Once per window, re-add the probability sums from the ring so rounding
    // of the running add/subtract cannot accumulate.
    for (int i = 0; i < total_experts_; ++i) {
      double sum = 0;
      for (int k = 0; k < ring_filled_; ++k) sum += ring_[k].prob_sum[i];
      window_.prob_sum[i] = sum;
    }
  }
}

void MoeMetrics::Publish() const {
  std::lock_guard<std::mutex> publish_lock(publish_mutex_);
  bool gauges_stale = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(pending_, publish_delta_);  // publish_delta_ was zero
    if (window_changed_) {
      publish_window_.tokens = window_.tokens;
      publish_window_.routed = window_.routed;
      publish_window_.prob_sum = window_.prob_sum;
      window_changed_ = false;
      gauges_stale = true;
    }
  }
  ApplyCounters(publish_delta_);
  publish_delta_.Zero();
  if (gauges_stale) ApplyGauges(publish_window_);
}

std::vector<prometheus::MetricFamily> MoeMetrics::Collect() const {
  Publish();
  return registry_.Collect();
}

void MoeMetrics::ApplyCounters(const FlatTotals& delta) const {
  // Zero increments are skipped: most dropped/rerouted counts are zero, and
  // each increment is an atomic read-modify-write.
  for (size_t r = 0; r < routers_.size(); ++r) {
    if (delta.tokens[r] == 0) continue;
    const RouterSeries& series = series_[r];
    series.tokens->Increment(static_cast<double>(delta.tokens[r]));
    for (int e = 0; e < routers_[r].n_experts; ++e) {
      const int i = series.expert_offset + e;
      if (delta.routed[i] != 0)
        series.assignments[e]->Increment(static_cast<double>(delta.routed[i]));
      if (delta.dropped[i] != 0)
        series.dropped[e]->Increment(static_cast<double>(delta.dropped[i]));
      if (delta.rerouted[i] != 0) {
        series.rerouted[e]->Increment(static_cast<double>(delta.rerouted[i]));
      }
      if (delta.prob_sum[i] != 0) series.prob_sum[e]->Increment(delta.prob_sum[i]);
    }
  }
}

void MoeMetrics::ApplyGauges(const FlatTotals& window) const {
  RouterStepStats& stats = publish_router_;
  for (size_t r = 0; r < routers_.size(); ++r) {
    if (window.tokens[r] <= 0) continue;
    const RouterSeries& series = series_[r];
    const int n = routers_[r].n_experts;
    stats.tokens = window.tokens[r];
    stats.routed.assign(window.routed.begin() + series.expert_offset,
                        window.routed.begin() + series.expert_offset + n);
    stats.prob_sum.assign(window.prob_sum.begin() + series.expert_offset,
                          window.prob_sum.begin() + series.expert_offset + n);
    const BalanceFigures figures = ComputeBalance(stats, routers_[r].top_k);
    series.aux_loss->Set(figures.aux_loss);
    series.load_cv->Set(figures.load_cv);
    series.dead_ratio->Set(figures.dead_fraction);
    series.entropy->Set(figures.entropy);
    series.max_utilization->Set(figures.max_utilization);
  }
}

}  // namespace switchserve
