#include "server/metrics/moe_metrics.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "prometheus/family.h"

namespace switchserve {
namespace {

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

MoeMetrics::MoeMetrics(prometheus::Registry& registry, std::vector<RouterId> routers,
                       MoeMetricsOptions options)
    : routers_(std::move(routers)), options_(options) {
  options_.window_steps = std::max(1, options_.window_steps);
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
      "Load-balancing loss E * sum_e f_e * P_e over the recent window (1 = balanced, E = "
      "collapsed).");
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
  window_.resize(routers_.size());
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
    window_[r].Reset(id.n_experts);
  }
  ring_tokens_.assign(options_.window_steps, std::vector<int64_t>(routers_.size(), 0));
  ring_routed_.assign(options_.window_steps, std::vector<int64_t>(total_experts_, 0));
  ring_prob_.assign(options_.window_steps, std::vector<double>(total_experts_, 0.0));
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
  UpdateCounters(step);
  AdvanceWindow(step);
  UpdateGauges();
  return absl::OkStatus();
}

void MoeMetrics::UpdateCounters(const StepRoutingStats& step) {
  // Zero increments are skipped: most dropped/rerouted counts are zero, and
  // each increment is an atomic read-modify-write.
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterStepStats& s = step.routers[r];
    RouterSeries& series = series_[r];
    if (s.tokens == 0) continue;
    series.tokens->Increment(static_cast<double>(s.tokens));
    for (int e = 0; e < routers_[r].n_experts; ++e) {
      if (s.routed[e] != 0) series.assignments[e]->Increment(static_cast<double>(s.routed[e]));
      if (s.dropped[e] != 0) series.dropped[e]->Increment(static_cast<double>(s.dropped[e]));
      if (s.rerouted[e] != 0) series.rerouted[e]->Increment(static_cast<double>(s.rerouted[e]));
      if (s.prob_sum[e] != 0) series.prob_sum[e]->Increment(s.prob_sum[e]);
    }
  }
}

void MoeMetrics::AdvanceWindow(const StepRoutingStats& step) {
  const int slot = ring_next_;
  std::vector<int64_t>& slot_tokens = ring_tokens_[slot];
  std::vector<int64_t>& slot_routed = ring_routed_[slot];
  std::vector<double>& slot_prob = ring_prob_[slot];
  for (size_t r = 0; r < routers_.size(); ++r) {
    const RouterStepStats& s = step.routers[r];
    RouterStepStats& w = window_[r];
    w.tokens += s.tokens - slot_tokens[r];
    slot_tokens[r] = s.tokens;
    const int base = series_[r].expert_offset;
    for (int e = 0; e < routers_[r].n_experts; ++e) {
      w.routed[e] += s.routed[e] - slot_routed[base + e];
      slot_routed[base + e] = s.routed[e];
      w.prob_sum[e] += s.prob_sum[e] - slot_prob[base + e];
      slot_prob[base + e] = s.prob_sum[e];
    }
  }
  ring_next_ = (ring_next_ + 1) % options_.window_steps;
  ring_filled_ = std::min(ring_filled_ + 1, options_.window_steps);
  if (ring_next_ == 0) {
    // Once per window, re-add the probability sums from the ring so rounding
    // of the running add/subtract cannot accumulate.
    for (size_t r = 0; r < routers_.size(); ++r) {
      const int base = series_[r].expert_offset;
      for (int e = 0; e < routers_[r].n_experts; ++e) {
        double sum = 0;
        for (int k = 0; k < ring_filled_; ++k) sum += ring_prob_[k][base + e];
        window_[r].prob_sum[e] = sum;
      }
    }
  }
}

void MoeMetrics::UpdateGauges() {
  for (size_t r = 0; r < routers_.size(); ++r) {
    if (window_[r].tokens <= 0) continue;
    const BalanceFigures figures = ComputeBalance(window_[r], routers_[r].top_k);
    RouterSeries& s = series_[r];
    s.aux_loss->Set(figures.aux_loss);
    s.load_cv->Set(figures.load_cv);
    s.dead_ratio->Set(figures.dead_fraction);
    s.entropy->Set(figures.entropy);
    s.max_utilization->Set(figures.max_utilization);
  }
}

}  // namespace switchserve
