#include "engine/moe/expert_dispatch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace switchserve {
namespace {

// Index of the highest score among experts not excluded; ties go to the lower
// index. -1 when every expert is excluded.
template <typename Excluded>
int BestExpert(const float* score, int n_experts, Excluded excluded) {
  int best = -1;
  for (int e = 0; e < n_experts; ++e) {
    if (excluded(e)) continue;
    if (best < 0 || score[e] > score[best]) best = e;
  }
  return best;
}

// The top_k experts by score, ties to the lower index, into chosen[0 ..
// top_k) in rank order: what top_k scans of BestExpert choose. Without a NaN
// score, in one pass: the experts in index order enter a list kept in rank
// order while it is short or where they score strictly higher than its last,
// and move ahead only of strictly lower scores, so of equal scores the lower
// index ranks first (32 experts, k = 4: 1.45x faster than the scans,
// dispatch_bench BM_Route). A NaN compares false with every score, so where
// it stands decides what the scans choose: such a row takes the scans.
void TopK(const float* score, int n_experts, int top_k, int32_t* chosen) {
  bool nan = false;
  for (int e = 0; e < n_experts; ++e) nan |= score[e] != score[e];
  if (nan) {
    std::vector<uint8_t> taken(n_experts, 0);  // the experts already chosen
    for (int r = 0; r < top_k; ++r) {
      chosen[r] = BestExpert(score, n_experts, [&](int e) { return taken[e] != 0; });
      taken[chosen[r]] = 1;
    }
    return;
  }
  int count = 0;
  for (int e = 0; e < n_experts; ++e) {
    const float s = score[e];
    if (count == top_k) {
      if (!(s > score[chosen[top_k - 1]])) continue;
      --count;  // the last one leaves the list
    }
    int p = count;
    for (; p > 0 && s > score[chosen[p - 1]]; --p) chosen[p] = chosen[p - 1];
    chosen[p] = e;
    ++count;
  }
}

}  // namespace

void RouteTokens(const float* logits, int64_t ld, int tokens, int n_experts, int top_k,
                 GateFunction gate, bool renormalize, RouterDecision* out) {
  SizeRouterDecision(tokens, n_experts, top_k, out);
  RouteTokenRows(logits, ld, 0, tokens, gate, renormalize, out);
}

void SizeRouterDecision(int tokens, int n_experts, int top_k, RouterDecision* out) {
  out->tokens = tokens;
  out->n_experts = n_experts;
  out->top_k = top_k;
  out->score.resize(static_cast<size_t>(tokens) * n_experts);
  out->prob.resize(static_cast<size_t>(tokens) * n_experts);
  out->gate_value.resize(static_cast<size_t>(tokens) * n_experts);
  out->expert.resize(static_cast<size_t>(tokens) * top_k);
  out->weight.resize(static_cast<size_t>(tokens) * top_k);
}

void RouteTokenRows(const float* logits, int64_t ld, int begin, int end, GateFunction gate,
                    bool renormalize, RouterDecision* out) {
  const int n_experts = out->n_experts, top_k = out->top_k;
  for (int t = begin; t < end; ++t) {
    const float* z = logits + t * ld;
    float* score = out->score.data() + static_cast<size_t>(t) * n_experts;
    float* prob = out->prob.data() + static_cast<size_t>(t) * n_experts;
    float* gate_value = out->gate_value.data() + static_cast<size_t>(t) * n_experts;
    int32_t* chosen = out->expert.data() + static_cast<size_t>(t) * top_k;
    float* weight = out->weight.data() + static_cast<size_t>(t) * top_k;

    if (gate == GateFunction::kSigmoid) {
      double sum = 0;
      for (int e = 0; e < n_experts; ++e) {
        gate_value[e] = 1.0f / (1.0f + std::exp(-z[e]));
        sum += gate_value[e];
      }
      for (int e = 0; e < n_experts; ++e) prob[e] = static_cast<float>(gate_value[e] / sum);
    } else {
      // Softmax over all experts (the gate for kSoftmax, the statistics'
      // probability for kSoftmax and kSoftmaxTopK), in double for stability.
      float zmax = z[0];
      for (int e = 1; e < n_experts; ++e) zmax = std::max(zmax, z[e]);
      double denom = 0;
      for (int e = 0; e < n_experts; ++e) denom += std::exp(static_cast<double>(z[e] - zmax));
      for (int e = 0; e < n_experts; ++e) {
        prob[e] = static_cast<float>(std::exp(static_cast<double>(z[e] - zmax)) / denom);
        gate_value[e] = prob[e];
      }
    }
    // Experts are ranked by logit whatever the gate (the gate functions are
    // monotonic; logits do not saturate into false ties).
    for (int e = 0; e < n_experts; ++e) score[e] = z[e];

    TopK(score, n_experts, top_k, chosen);

    if (gate == GateFunction::kSoftmaxTopK) {
      const float zk = z[chosen[0]];  // the largest selected logit
      double sum = 0;
      for (int r = 0; r < top_k; ++r) sum += std::exp(static_cast<double>(z[chosen[r]] - zk));
      for (int r = 0; r < top_k; ++r) {
        weight[r] = static_cast<float>(std::exp(static_cast<double>(z[chosen[r]] - zk)) / sum);
      }
    } else {
      double sum = 0;
      for (int r = 0; r < top_k; ++r) {
        weight[r] = gate_value[chosen[r]];
        sum += weight[r];
      }
      if (renormalize && sum > 0) {
        for (int r = 0; r < top_k; ++r) weight[r] = static_cast<float>(weight[r] / sum);
      }
    }
  }
}

namespace {

// Decides the fate of assignment a (token t, its rank-r choice) against
// `load`, as the header describes. `taken` is the token's [E] set of experts
// chosen or moved to (reroute only).
void Place(const RouterDecision& decision, int t, int r, int64_t capacity, bool reroute,
           int32_t* load, uint8_t* taken, RouteChoice* choice) {
  const int E = decision.n_experts;
  const size_t a = static_cast<size_t>(t) * decision.top_k + r;
  const int e = decision.expert[a];
  choice->expert = e;
  choice->gate = decision.weight[a];
  if (load[e] < capacity) {
    choice->fate = RouteFate::kKept;
    ++load[e];
    return;
  }
  if (reroute) {
    const float* score = decision.score.data() + static_cast<size_t>(t) * E;
    const int target =
        BestExpert(score, E, [&](int x) { return taken[x] != 0 || load[x] >= capacity; });
    if (target >= 0) {
      taken[target] = 1;
      choice->expert = target;
      choice->fate = RouteFate::kRerouted;
      ++load[target];
      return;
    }
  }
  choice->fate = RouteFate::kDropped;  // keeps the weight it would have had
}

// Marks token t's k choices in its [E] `taken` row.
void MarkChosen(const RouterDecision& decision, int t, uint8_t* taken) {
  const int32_t* chosen = decision.expert.data() + static_cast<size_t>(t) * decision.top_k;
  for (int r = 0; r < decision.top_k; ++r) taken[chosen[r]] = 1;
}

void FillStepScope(const RouterDecision& decision, int64_t capacity, bool reroute,
                   ExpertAssignments* out) {
  const int T = decision.tokens, E = decision.n_experts, K = decision.top_k;
  std::vector<int32_t>& load = out->load_scratch;
  load.assign(E, 0);
  std::vector<uint8_t>& taken = out->taken_scratch;  // [T, E]
  if (reroute) {
    taken.assign(static_cast<size_t>(T) * E, 0);
    for (int t = 0; t < T; ++t) MarkChosen(decision, t, taken.data() + static_cast<size_t>(t) * E);
  }
  for (int r = 0; r < K; ++r) {
    for (int t = 0; t < T; ++t) {
      Place(decision, t, r, capacity, reroute, load.data(),
            reroute ? taken.data() + static_cast<size_t>(t) * E : nullptr,
            &out->trace[static_cast<size_t>(t) * K + r]);
    }
  }
}

void FillSequenceScope(const RouterDecision& decision, int group_size, int64_t capacity,
                       bool reroute, const SequenceGroups* groups, ExpertAssignments* out) {
  const int T = decision.tokens, E = decision.n_experts, K = decision.top_k;
  std::vector<uint8_t>& taken = out->taken_scratch;  // [E], the current token's
  taken.assign(E, 0);
  std::vector<int32_t>& own_loads = out->load_scratch;  // groups == null: one sequence
  if (groups == nullptr) own_loads.assign(E, 0);
  for (int t = 0; t < T; ++t) {
    const int32_t position = groups != nullptr ? groups->positions[t] : t;
    int32_t* load = groups != nullptr
                        ? groups->loads + groups->token_sequence[t] * groups->loads_stride
                        : own_loads.data();
    if (position % group_size == 0) std::fill(load, load + E, 0);
    if (reroute) {
      std::fill(taken.begin(), taken.end(), 0);
      MarkChosen(decision, t, taken.data());
    }
    for (int r = 0; r < K; ++r) {
      Place(decision, t, r, capacity, reroute, load, taken.data(),
            &out->trace[static_cast<size_t>(t) * K + r]);
    }
  }
}

}  // namespace

void DispatchTokens(const RouterDecision& decision, const DispatchConfig& dispatch,
                    const SequenceGroups* groups, ExpertAssignments* out, RouterStepStats* stats) {
  const int T = decision.tokens;
  const int E = decision.n_experts;
  const int K = decision.top_k;
  const bool dropless = dispatch.Dropless();
  const bool sequence_scope = dispatch.scope == CapacityScope::kSequence;
  const int64_t capacity = dropless ? 0 : dispatch.SlotsPerExpert(T, K, E);
  const bool reroute = dispatch.overflow == OverflowPolicy::kReroute;

  out->n_experts = E;
  out->capacity = capacity;
  out->trace.assign(static_cast<size_t>(T) * K, RouteChoice{});
  out->offsets.assign(E + 1, 0);

  // Pass 1: every assignment's fate.
  if (dropless) {
    for (size_t a = 0; a < out->trace.size(); ++a) {
      out->trace[a] = {decision.expert[a], decision.weight[a], RouteFate::kKept};
    }
  } else if (sequence_scope) {
    FillSequenceScope(decision, dispatch.capacity_group, capacity, reroute, groups, out);
  } else {
    FillStepScope(decision, capacity, reroute, out);
  }

  // Pass 2: bucket the kept assignments by expert, in fill order.
  std::vector<int32_t>& cursor = out->cursor_scratch;
  cursor.assign(E, 0);
  for (const RouteChoice& choice : out->trace) {
    if (choice.fate != RouteFate::kDropped) ++cursor[choice.expert];
  }
  for (int e = 0; e < E; ++e) out->offsets[e + 1] = out->offsets[e] + cursor[e];
  out->token.resize(out->offsets[E]);
  out->weight.resize(out->offsets[E]);
  cursor.assign(out->offsets.begin(), out->offsets.end() - 1);
  auto bucket = [&](int t, int r) {
    const RouteChoice& choice = out->trace[static_cast<size_t>(t) * K + r];
    if (choice.fate == RouteFate::kDropped) return;
    const int32_t slot = cursor[choice.expert]++;
    out->token[slot] = t;
    out->weight[slot] = choice.gate;
  };
  if (sequence_scope) {
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < K; ++r) bucket(t, r);
    }
  } else {
    for (int r = 0; r < K; ++r) {
      for (int t = 0; t < T; ++t) bucket(t, r);
    }
  }

  if (stats == nullptr) return;
  stats->tokens += T;
  for (int t = 0; t < T; ++t) {
    const float* prob = decision.prob.data() + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) stats->prob_sum[e] += prob[e];
    for (int r = 0; r < K; ++r) {
      const size_t a = static_cast<size_t>(t) * K + r;
      const int routed_to = decision.expert[a];
      const RouteChoice& choice = out->trace[a];
      ++stats->routed[routed_to];
      switch (choice.fate) {
        case RouteFate::kKept:
          ++stats->kept[routed_to];
          break;
        case RouteFate::kRerouted:
          ++stats->rerouted[routed_to];
          ++stats->kept[choice.expert];
          break;
        case RouteFate::kDropped:
          ++stats->dropped[routed_to];
          break;
      }
    }
  }
}

}  // namespace switchserve
