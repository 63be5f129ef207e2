#include "engine/moe/routing_stats.h"

#include <algorithm>
#include <cmath>

namespace switchserve {

void RouterStepStats::Reset(int n_experts) {
  tokens = 0;
  routed.assign(n_experts, 0);
  kept.assign(n_experts, 0);
  rerouted.assign(n_experts, 0);
  dropped.assign(n_experts, 0);
  prob_sum.assign(n_experts, 0.0);
}

void RouterStepStats::Add(const RouterStepStats& other) {
  if (routed.empty() && !other.routed.empty()) Reset(static_cast<int>(other.routed.size()));
  tokens += other.tokens;
  for (size_t e = 0; e < routed.size() && e < other.routed.size(); ++e) {
    routed[e] += other.routed[e];
    kept[e] += other.kept[e];
    rerouted[e] += other.rerouted[e];
    dropped[e] += other.dropped[e];
    prob_sum[e] += other.prob_sum[e];
  }
}

void StepRoutingStats::Reset(const std::vector<RouterId>& ids) {
  routers.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) routers[i].Reset(ids[i].n_experts);
}

void StepRoutingStats::Add(const StepRoutingStats& other) {
  if (routers.size() < other.routers.size()) routers.resize(other.routers.size());
  for (size_t i = 0; i < other.routers.size(); ++i) routers[i].Add(other.routers[i]);
}

BalanceFigures ComputeBalance(const RouterStepStats& stats, int top_k) {
  BalanceFigures out;
  const int n = static_cast<int>(stats.routed.size());
  if (n == 0 || stats.tokens <= 0 || top_k <= 0) return out;
  const double assignments = static_cast<double>(stats.tokens) * top_k;
  const double tokens = static_cast<double>(stats.tokens);
  double aux = 0, total = 0;
  int dead = 0;
  double max_load = 0;
  for (int e = 0; e < n; ++e) {
    const double load = static_cast<double>(stats.routed[e]);
    aux += (load / assignments) * (stats.prob_sum[e] / tokens);
    total += load;
    if (stats.routed[e] == 0) ++dead;
    max_load = std::max(max_load, load);
  }
  out.aux_loss = n * aux;
  out.dead_fraction = static_cast<double>(dead) / n;
  out.max_utilization = max_load / (assignments / n);
  const double mean = total / n;
  if (mean > 0) {
    double var = 0, entropy = 0;
    for (int e = 0; e < n; ++e) {
      const double load = static_cast<double>(stats.routed[e]);
      var += (load - mean) * (load - mean);
      if (load > 0) {
        const double share = load / total;
        entropy -= share * std::log(share);
      }
    }
    out.load_cv = std::sqrt(var / n) / mean;
    out.entropy = entropy;
  }
  return out;
}

}  // namespace switchserve
