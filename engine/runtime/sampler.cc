#include "engine/runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

namespace switchserve {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// A logit as the sampler's comparisons and arithmetic need it: finite. NaN
// ranks below every number (the least likely token), +-inf as the largest
// finite magnitudes; sort comparators then see a strict weak order, and no
// probability becomes NaN.
float Finite(float v) {
  constexpr float kMax = std::numeric_limits<float>::max();
  if (std::isnan(v)) return -kMax;
  return std::clamp(v, -kMax, kMax);
}

// Whether a candidate scoring `score` has no chance beside the best's `top`:
// it scores the lowest finite value (a logit of -inf or NaN, a bias of -inf,
// an id outside allowed_token_ids) and the best does not. Its weight is then
// 0 at any temperature; exp((score - top) / temperature) is not at one past
// about 1e36.
bool Excluded(float score, double top) {
  constexpr float kLowest = -std::numeric_limits<float>::max();
  return score == kLowest && top > kLowest;
}

// A sample's candidates, most likely first (ties: lower id first), sorted
// only as far as they are read: a draw reads a prefix (the top-p nucleus,
// the ids before the drawn one), rarely the whole vocabulary, whose sort
// took 3 ms a token at 32,000 ids. Each candidate is one 64-bit key, its
// score's order above its id, so that selecting and sorting compare
// integers in place rather than looking scores up by id.
class Candidates {
 public:
  explicit Candidates(const std::vector<float>& scores) : keys_(scores.size()) {
    for (size_t id = 0; id < scores.size(); ++id) {
      // -0 as +0 (they tie, as floats compare); finite, so no NaN.
      const float score = scores[id] == 0.0f ? 0.0f : scores[id];
      const auto bits = std::bit_cast<uint32_t>(score);
      // Ascending with the score, then flipped: the most likely first.
      const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
      keys_[id] = (uint64_t{~ascending} << 32) | static_cast<uint32_t>(id);
    }
  }

  // The i-th most likely id (i < the vocabulary).
  int32_t operator[](int32_t i) {
    if (i >= sorted_) SortTo(i + 1);
    return static_cast<int32_t>(keys_[i] & 0xffffffffu);
  }

 private:
  // keys_[0, sorted_) holds the most likely in order; the rest, any order.
  // Grows the sorted part geometrically, to at least `n`.
  void SortTo(int32_t n) {
    const auto size = static_cast<int32_t>(keys_.size());
    n = std::min(size, std::max({n, 64, 2 * sorted_}));
    if (n < size) std::nth_element(keys_.begin() + sorted_, keys_.begin() + n, keys_.end());
    std::sort(keys_.begin() + sorted_, keys_.begin() + n);
    sorted_ = n;
  }

  std::vector<uint64_t> keys_;
  int32_t sorted_ = 0;
};

std::vector<float> FiniteCopy(absl::Span<const float> logits) {
  std::vector<float> finite(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) finite[i] = Finite(logits[i]);
  return finite;
}

// Lowest id among the maxima: deterministic greedy ties. `values` are
// finite. The maximum first, in eight independent lanes (one running
// maximum is a chain of dependent compares, about 1 ns an id), then its
// first place.
int32_t ArgMax(absl::Span<const float> values) {
  const size_t n = values.size();
  float lanes[8];
  std::fill(lanes, lanes + 8, values[0]);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] = std::max(lanes[l], values[i + l]);
  }
  for (; i < n; ++i) lanes[0] = std::max(lanes[0], values[i]);
  const float best = *std::max_element(lanes, lanes + 8);
  return static_cast<int32_t>(std::find(values.begin(), values.end(), best) - values.begin());
}

// log-softmax of the raw logits at the sampled token and the top `n`
// alternatives, when any logprob is wanted: (x - max) - log(sum), whose
// error is relative to the logprob's own size (adding the max to the log-sum
// first would round a likely token's logprob to the max's ulp).
void FillLogprobs(absl::Span<const float> logits, int n, bool wanted, SampleResult* result) {
  if (!wanted && n <= 0) return;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - max_logit));
  const float log_sum = static_cast<float>(std::log(sum));
  result->logprob = (logits[result->token_id] - max_logit) - log_sum;
  if (n <= 0) return;
  n = std::min<int>(n, logits.size());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  result->top_logprobs.reserve(n);
  for (int i = 0; i < n; ++i) {
    result->top_logprobs.emplace_back(order[i], (logits[order[i]] - max_logit) - log_sum);
  }
}

// A non-greedy draw from `scores` (made finite, biased and penalised):
// candidates most likely first (ties: lower id first), cut by top-k, top-p
// and min-p in that order, each weighing exp((score - top) / temperature),
// the first whose running weight exceeds a uniform draw times the total.
int32_t DrawToken(const std::vector<float>& scores, const SamplingParams& params, SamplerRng& rng) {
  const auto vocab = static_cast<int32_t>(scores.size());
  Candidates order(scores);
  const double inv_t = 1.0 / params.temperature;
  const double top = scores[order[0]];
  std::vector<double> probs;  // of order[0], order[1], ..., as far as read
  auto prob = [&](int32_t i) {
    while (static_cast<int32_t>(probs.size()) <= i) {
      const float score = scores[order[static_cast<int32_t>(probs.size())]];
      probs.push_back(Excluded(score, top) ? 0.0 : std::exp((score - top) * inv_t));
    }
    return probs[i];
  };
  int32_t keep = vocab;
  double total = 0;
  if (params.top_k > 0 && params.top_k < vocab) {
    keep = params.top_k;
    for (int32_t i = 0; i < keep; ++i) total += prob(i);
  } else {
    // Every id's weight, in id order: no sort.
    for (int32_t id = 0; id < vocab; ++id) {
      total += Excluded(scores[id], top) ? 0.0 : std::exp((scores[id] - top) * inv_t);
    }
  }
  const int32_t before_cuts = keep;
  if (params.top_p < 1.0f) {
    double cumulative = 0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cumulative += prob(i) / total;
      if (cumulative >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (params.min_p > 0.0f) {
    // prob(0) is the most likely candidate's (unnormalised) weight.
    const double threshold = params.min_p * prob(0);
    int32_t cut = 1;
    while (cut < keep && prob(cut) >= threshold) ++cut;
    keep = cut;
  }
  if (keep < before_cuts) {
    total = 0;
    for (int32_t i = 0; i < keep; ++i) total += prob(i);
  }

  const double target = rng.Uniform() * total;
  double cumulative = 0;
  int32_t token = -1;
  for (int32_t i = 0; i < keep; ++i) {
    cumulative += prob(i);
    if (target < cumulative) {
      token = order[i];
      break;
    }
  }
  return token >= 0 ? token : order[keep - 1];
}

}  // namespace

SamplerRng::SamplerRng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& word : s_) word = SplitMix64(state);
}

uint64_t SamplerRng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double SamplerRng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

SampleResult TokenLogprobs(absl::Span<const float> logits, int32_t token, int num_logprobs) {
  SampleResult result;
  result.token_id = token;
  const std::vector<float> finite = FiniteCopy(logits);
  FillLogprobs(finite, num_logprobs, /*wanted=*/true, &result);
  const float own = finite[token];
  result.rank = 1 + static_cast<int32_t>(std::count_if(finite.begin(), finite.end(),
                                                       [own](float v) { return v > own; }));
  return result;
}

std::vector<std::pair<int32_t, float>> SampleBiases(const SamplingParams& params,
                                                    absl::Span<const int32_t> generated) {
  std::vector<int32_t> banned;
  if (params.HoldsBackStops(static_cast<int64_t>(generated.size()))) {
    banned = params.min_tokens_ids;
  }
  for (const std::vector<int32_t>& word : params.bad_words_ids) {
    const size_t before = word.size() - 1;
    if (before <= generated.size() &&
        std::equal(word.begin(), word.end() - 1, generated.end() - before)) {
      banned.push_back(word.back());
    }
  }
  if (banned.empty()) return params.logit_bias;
  std::sort(banned.begin(), banned.end());
  banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
  std::vector<std::pair<int32_t, float>> biases;
  biases.reserve(params.logit_bias.size() + banned.size());
  auto bias = params.logit_bias.begin();
  for (const int32_t id : banned) {
    for (; bias != params.logit_bias.end() && bias->first < id; ++bias) biases.push_back(*bias);
    if (bias != params.logit_bias.end() && bias->first == id) ++bias;
    biases.emplace_back(id, -std::numeric_limits<float>::infinity());
  }
  biases.insert(biases.end(), bias, params.logit_bias.end());
  return biases;
}

SampleResult SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         absl::Span<const int32_t> history, int64_t prompt_length, int num_logprobs,
                         SamplerRng& rng) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  const std::vector<float> finite = FiniteCopy(logits);
  std::vector<float> scores;
  if (params.allowed_token_ids.empty()) {
    scores = finite;
  } else {
    scores.assign(vocab, -std::numeric_limits<float>::max());
    for (const int32_t id : params.allowed_token_ids) {
      if (id >= 0 && id < vocab) scores[id] = finite[id];
    }
  }
  for (const auto& [id, bias] :
       SampleBiases(params, history.subspan(static_cast<size_t>(prompt_length)))) {
    if (id >= 0 && id < vocab) scores[id] = Finite(scores[id] + bias);
  }
  if (params.repetition_penalty != 1.0f) {
    std::vector<bool> seen(vocab, false);
    for (int32_t id : history) {
      if (id < 0 || id >= vocab || seen[id]) continue;
      seen[id] = true;
      float& s = scores[id];
      // The lowest score stays the lowest (-inf times a penalty below 1 is
      // -inf): a banned id is not lifted back among the others.
      if (s == -std::numeric_limits<float>::max()) continue;
      s = Finite(s > 0 ? s / params.repetition_penalty : s * params.repetition_penalty);
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    // The generated ids sorted: each distinct id's count is its run, in
    // memory of the history's length rather than the vocabulary's.
    const auto generated = history.subspan(static_cast<size_t>(prompt_length));
    std::vector<int32_t> ids(generated.begin(), generated.end());
    std::sort(ids.begin(), ids.end());
    for (size_t run = 0; run < ids.size();) {
      const int32_t id = ids[run];
      size_t end = run + 1;
      while (end < ids.size() && ids[end] == id) ++end;
      if (id >= 0 && id < vocab) {
        // One fused multiply-add, as the CUDA sampler computes it.
        const float penalty = std::fma(params.frequency_penalty, static_cast<float>(end - run),
                                       params.presence_penalty);
        scores[id] = Finite(scores[id] - penalty);
      }
      run = end;
    }
  }

  SampleResult result;
  result.token_id = params.temperature == 0.0f ? ArgMax(scores) : DrawToken(scores, params, rng);
  FillLogprobs(finite, num_logprobs, params.sampled_logprob, &result);
  return result;
}

}  // namespace switchserve
