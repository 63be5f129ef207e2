#include "engine/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/routing_stats.h"
#include "gtest/gtest.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

using testing::AllVariantConfigs;
using testing::NamedConfig;
using testing::RandomWeights;

constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 64;
// Two threads attending in parallel however small the step.
const CpuBackendOptions kParallel = {.num_threads = 2, .parallel_attention_min_macs = 0};

std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& v : t) v = static_cast<int32_t>(rng() % vocab);
  return t;
}

// max |a - b| / max |b|
double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<float> Slice(const std::vector<float>& v, size_t row, size_t width) {
  return std::vector<float>(v.begin() + row * width, v.begin() + (row + 1) * width);
}

// A backend plus the block accounting a scheduler would do.
class Harness {
 public:
  Harness(const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch,
          const CpuBackendOptions& options = {})
      : config_(config),
        backend_(CreateCpuBackend(config, weights, dispatch, options)),
        alloc_(kNumBlocks, kBlockSize) {
    EXPECT_TRUE(backend_->InitKvCache(kNumBlocks, kBlockSize).ok());
    // Occupy a few blocks so sequences get non-contiguous, non-zero block ids.
    EXPECT_TRUE(alloc_.Reserve(-1, 3 * kBlockSize).ok());
  }

  struct Chunk {
    SequenceId seq;
    std::vector<int32_t> tokens;
    int start;
    LogitsMode logits = LogitsMode::kAll;
    bool collect = false;
  };

  absl::Status Step(const std::vector<Chunk>& chunks, StepOutput* out) {
    StepInput input;
    for (const Chunk& c : chunks) {
      EXPECT_TRUE(alloc_.Reserve(c.seq, c.start + static_cast<int64_t>(c.tokens.size())).ok());
    }
    for (const Chunk& c : chunks) {
      SequenceChunk sc;
      sc.tokens = c.tokens;
      sc.start_pos = c.start;
      sc.block_table = &alloc_.BlockTable(c.seq);
      sc.logits = c.logits;
      sc.collect_routing = c.collect;
      input.chunks.push_back(sc);
    }
    return backend_->Forward(input, out);
  }

  // Logits of all rows of one chunk run alone.
  std::vector<float> Run(SequenceId seq, const std::vector<int32_t>& tokens, int start) {
    StepOutput out;
    EXPECT_TRUE(Step({{seq, tokens, start}}, &out).ok());
    return out.logits;
  }

  Backend& backend() { return *backend_; }
  KvBlockAllocator& alloc() { return alloc_; }

 private:
  ModelConfig config_;
  std::unique_ptr<Backend> backend_;
  KvBlockAllocator alloc_;
};

class CpuBackendVariantTest : public ::testing::TestWithParam<NamedConfig> {};

// (a) Decoding token by token through the paged cache, and prefilling in two
// chunks, equal one prefill of all tokens.
TEST_P(CpuBackendVariantTest, DecodeAndChunkedPrefillMatchPrefill) {
  const ModelConfig config = GetParam().config;
  const ModelWeights weights = RandomWeights(config, 7);
  // 19 tokens: the full prefill and both chunks (8 + 11) attend tile by tile,
  // the decode steps token by token.
  const int n = 19, V = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(n, V, 3);

  Harness full(config, weights, config.dispatch, kParallel);
  const std::vector<float> reference = full.Run(1, tokens, 0);
  ASSERT_EQ(reference.size(), static_cast<size_t>(n) * V);

  Harness decode(config, weights, config.dispatch);
  for (int i = 0; i < n; ++i) {
    const std::vector<float> row = decode.Run(1, {tokens[i]}, i);
    EXPECT_LE(RelError(row, Slice(reference, i, V)), 1e-4) << "position " << i;
  }

  Harness chunked(config, weights, config.dispatch);
  const int split = 8;
  std::vector<float> got =
      chunked.Run(1, std::vector<int32_t>(tokens.begin(), tokens.begin() + split), 0);
  const std::vector<float> rest =
      chunked.Run(1, std::vector<int32_t>(tokens.begin() + split, tokens.end()), split);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_LE(RelError(got, reference), 1e-4);
}

// (b) A batch mixing prefill chunks and decodes equals each sequence alone
// (dropless dispatch).
TEST_P(CpuBackendVariantTest, MixedBatchMatchesSequencesAlone) {
  const ModelConfig config = GetParam().config;
  const ModelWeights weights = RandomWeights(config, 11);
  const int V = config.vocab_size;
  const auto a = RandomTokens(5, V, 21), b = RandomTokens(4, V, 22), c = RandomTokens(6, V, 23);

  Harness batched(config, weights, config.dispatch, kParallel);
  StepOutput out;
  // Step 1: b's first 3 tokens and c's first 2, together.
  ASSERT_TRUE(batched
                  .Step({{2, {b.begin(), b.begin() + 3}, 0, LogitsMode::kNone},
                         {3, {c.begin(), c.begin() + 2}, 0, LogitsMode::kNone}},
                        &out)
                  .ok());
  EXPECT_TRUE(out.logits.empty());
  // Step 2: a's prefill, b's decode, c's second chunk.
  ASSERT_TRUE(batched
                  .Step({{1, a, 0, LogitsMode::kAll},
                         {2, {b[3]}, 3, LogitsMode::kLast},
                         {3, {c.begin() + 2, c.end()}, 2, LogitsMode::kLast}},
                        &out)
                  .ok());
  ASSERT_EQ(out.row_chunk.size(), 5u + 1 + 1);
  EXPECT_EQ(out.row_chunk[5], 1);
  EXPECT_EQ(out.row_position[5], 3);
  EXPECT_EQ(out.row_chunk[6], 2);
  EXPECT_EQ(out.row_position[6], 5);

  Harness alone(config, weights, config.dispatch);
  const std::vector<float> ra = alone.Run(1, a, 0);
  alone.Run(2, {b.begin(), b.begin() + 3}, 0);
  const std::vector<float> rb = alone.Run(2, {b[3]}, 3);
  alone.Run(3, {c.begin(), c.begin() + 2}, 0);
  const std::vector<float> rc = alone.Run(3, {c.begin() + 2, c.end()}, 2);

  for (int i = 0; i < 5; ++i) {
    EXPECT_LE(RelError(Slice(out.logits, i, V), Slice(ra, i, V)), 1e-4) << "a row " << i;
  }
  EXPECT_LE(RelError(Slice(out.logits, 5, V), rb), 1e-4);
  EXPECT_LE(RelError(Slice(out.logits, 6, V), Slice(rc, 3, V)), 1e-4);
}

// (c) Under capacity pressure the statistics and traces are consistent.
TEST_P(CpuBackendVariantTest, CapacityStatsAreConsistent) {
  const ModelConfig config = GetParam().config;
  const std::vector<RouterId> routers = EnumerateRouters(config);
  if (routers.empty()) GTEST_SKIP() << "no routers";
  const ModelWeights weights = RandomWeights(config, 5);
  for (OverflowPolicy policy : {OverflowPolicy::kDrop, OverflowPolicy::kReroute}) {
    DispatchConfig dispatch;
    dispatch.capacity_factor = 0.5;
    dispatch.overflow = policy;
    Harness h(config, weights, dispatch);
    StepOutput out;
    const auto a = RandomTokens(9, config.vocab_size, 31);
    const auto b = RandomTokens(7, config.vocab_size, 32);
    ASSERT_TRUE(
        h.Step({{1, a, 0, LogitsMode::kAll, true}, {2, b, 0, LogitsMode::kAll, true}}, &out).ok());
    const int T = 16;
    ASSERT_EQ(out.stats.routers.size(), routers.size());
    ASSERT_EQ(out.routing.size(), static_cast<size_t>(T));
    int64_t dropped_total = 0;
    for (size_t r = 0; r < routers.size(); ++r) {
      const RouterStepStats& s = out.stats.routers[r];
      const int E = routers[r].n_experts, k = routers[r].top_k;
      EXPECT_EQ(s.tokens, T);
      // Offset of this router's choices in each TokenRouting.
      size_t offset = 0;
      for (size_t q = 0; q < r; ++q) offset += routers[q].top_k;
      std::vector<int64_t> rerouted_in(E, 0), kept_trace(E, 0);
      int64_t dropped_trace = 0;
      for (int t = 0; t < T; ++t) {
        ASSERT_GE(out.routing[t].choices.size(), offset + k);
        for (int i = 0; i < k; ++i) {
          const RouteChoice& ch = out.routing[t].choices[offset + i];
          if (ch.fate == RouteFate::kRerouted) ++rerouted_in[ch.expert];
          if (ch.fate == RouteFate::kDropped) ++dropped_trace;
          if (ch.fate != RouteFate::kDropped) ++kept_trace[ch.expert];
        }
      }
      const int64_t capacity = dispatch.CapacityPerExpert(T, k, E);
      int64_t routed = 0, kept = 0, dropped = 0, rerouted = 0;
      double prob = 0;
      for (int e = 0; e < E; ++e) {
        EXPECT_EQ(s.routed[e], s.kept[e] - rerouted_in[e] + s.rerouted[e] + s.dropped[e])
            << "router " << r << " expert " << e;
        EXPECT_EQ(s.kept[e], kept_trace[e]);
        EXPECT_LE(s.kept[e], capacity);
        routed += s.routed[e];
        kept += s.kept[e];
        dropped += s.dropped[e];
        rerouted += s.rerouted[e];
        prob += s.prob_sum[e];
      }
      EXPECT_EQ(routed, static_cast<int64_t>(T) * k);
      EXPECT_EQ(kept + dropped, static_cast<int64_t>(T) * k);
      EXPECT_EQ(dropped, dropped_trace);
      if (policy == OverflowPolicy::kDrop) {
        EXPECT_EQ(rerouted, 0);
      }
      EXPECT_NEAR(prob, T, 1e-3);
      dropped_total += dropped;
    }
    EXPECT_GT(dropped_total, 0) << "capacity 0.5 should drop something";
  }
}

// (d) Malformed input is rejected and leaves the cache untouched.
TEST_P(CpuBackendVariantTest, BadInputIsRejectedAndCacheUntouched) {
  const ModelConfig config = GetParam().config;
  const ModelWeights weights = RandomWeights(config, 9);
  const auto prompt = RandomTokens(6, config.vocab_size, 41);
  const auto other = RandomTokens(6, config.vocab_size, 42);

  Harness clean(config, weights, config.dispatch);
  Harness probed(config, weights, config.dispatch);
  clean.Run(1, prompt, 0);
  probed.Run(1, prompt, 0);

  // Each bad step also carries a valid chunk that would overwrite sequence 1's
  // cached positions with other tokens if anything were written.
  std::vector<int32_t> short_table = {0};
  std::vector<int32_t> bad_block = {kNumBlocks + 5};
  std::vector<SequenceChunk> bad(4);
  bad[0].tokens = {config.vocab_size};
  bad[1].tokens = {1};
  bad[1].start_pos = config.max_seq_len;
  bad[2].tokens = {1, 2, 3, 4, 5};
  bad[2].block_table = &short_table;
  bad[3].tokens = {1};
  bad[3].block_table = &bad_block;
  std::vector<int32_t> long_table(config.max_seq_len / kBlockSize + 1, 0);
  bad[0].block_table = &long_table;
  bad[1].block_table = &long_table;
  for (const SequenceChunk& chunk : bad) {
    StepInput input;
    SequenceChunk valid;
    valid.tokens = other;
    valid.block_table = &probed.alloc().BlockTable(1);
    input.chunks = {valid, chunk};
    StepOutput out;
    EXPECT_EQ(probed.backend().Forward(input, &out).code(), absl::StatusCode::kInvalidArgument);
  }
  StepInput missing;
  missing.chunks.resize(1);
  missing.chunks[0].tokens = {1};
  StepOutput out;
  EXPECT_EQ(probed.backend().Forward(missing, &out).code(), absl::StatusCode::kInvalidArgument);

  const std::vector<float> want = clean.Run(1, {prompt[0]}, 6);
  const std::vector<float> got = probed.Run(1, {prompt[0]}, 6);
  EXPECT_EQ(got, want);
}

// ---------------------------------------------------------------------------
// (e) A naive reference: one sequence, double precision, no paging, no BLAS,
// written straight from DESIGN.md.

using Vec = std::vector<double>;

Vec Norm(const ModelConfig& c, const Vec& x, const Tensor& w, const Tensor& b) {
  const int d = c.d_model;
  double mean = 0, var = 0;
  if (c.norm == NormKind::kLayerNorm) {
    for (double v : x) mean += v;
    mean /= d;
  }
  for (double v : x) var += (v - mean) * (v - mean);
  var /= d;
  Vec out(d);
  for (int i = 0; i < d; ++i) {
    out[i] = (x[i] - mean) / std::sqrt(var + c.norm_eps) * w.data[i] + (b.empty() ? 0 : b.data[i]);
  }
  return out;
}

// rows x cols matrix at `m` (row-major) times x.
Vec MatVec(const float* m, int rows, int cols, const Vec& x) {
  Vec out(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[r] += static_cast<double>(m[r * cols + c]) * x[c];
  }
  return out;
}

// x (length rows) times m [rows, cols].
Vec VecMat(const Vec& x, const float* m, int rows, int cols) {
  Vec out(cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[c] += x[r] * m[r * cols + c];
  }
  return out;
}

double Sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Chosen experts (rank order) and weights of one routed head.
struct Route {
  std::vector<int> experts;
  Vec weights;
};

Route TopK(const Vec& z, int k, bool softmax_topk) {
  const int E = static_cast<int>(z.size());
  std::vector<int> order(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  Route r;
  r.experts.assign(order.begin(), order.begin() + k);
  double sum = 0;
  for (int e : r.experts) sum += std::exp(z[e] - z[r.experts[0]]);
  for (int e : r.experts) {
    r.weights.push_back(softmax_topk ? std::exp(z[e] - z[r.experts[0]]) / sum : Sig(z[e]));
  }
  return r;
}

void Rope(const ModelConfig& c, double* v, int pos) {
  const int n_rot = c.attention.RotaryDims(), half = n_rot / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = pos * std::pow(c.attention.rope_base, -2.0 * i / n_rot);
    const double a = v[i], b = v[i + half];
    v[i] = a * std::cos(angle) - b * std::sin(angle);
    v[i + half] = b * std::cos(angle) + a * std::sin(angle);
  }
}

double Act(Activation act, double v) {
  switch (act) {
    case Activation::kRelu:
      return v > 0 ? v : 0;
    case Activation::kGelu:
      return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::kSilu:
      return v * Sig(v);
  }
  return 0;
}

std::vector<Vec> NaiveAttention(const ModelConfig& c, const AttentionWeights& w,
                                const std::vector<Vec>& xs) {
  const AttentionConfig& a = c.attention;
  const int T = static_cast<int>(xs.size()), d = c.d_model;
  const int H = a.n_heads, G = a.n_kv_heads, dh = a.head_dim, E = a.n_experts, k = a.top_k;
  const bool routed = a.IsRouted(), softmax_topk = a.gate == AttentionGate::kSoftmaxTopK;
  const bool destination = routed && a.value_routing == ValueRouting::kDestination;
  const double s = std::pow(dh, -0.25);
  std::vector<Vec> q(T), kk(T);
  // values[t][g][e] (e = 0 only unless destination)
  std::vector<std::vector<std::vector<Vec>>> values(T);
  std::vector<std::vector<Route>> vroute(T);  // per token, per KV head
  for (int t = 0; t < T; ++t) {
    q[t] = MatVec(w.q.ptr(), H * dh, d, xs[t]);
    kk[t] = MatVec(w.k.ptr(), G * dh, d, xs[t]);
    for (double& v : q[t]) v *= s;
    for (double& v : kk[t]) v *= s;
    for (int h = 0; h < H; ++h) Rope(c, q[t].data() + h * dh, t);
    for (int g = 0; g < G; ++g) Rope(c, kk[t].data() + g * dh, t);
    values[t].resize(G);
    vroute[t].resize(G);
    for (int g = 0; g < G; ++g) {
      if (!routed) {
        values[t][g].push_back(MatVec(w.v.ptr() + g * dh * d, dh, d, xs[t]));
        continue;
      }
      const int r = a.shared_router ? 0 : g;
      vroute[t][g] = TopK(MatVec(w.sel_v.ptr() + r * E * d, E, d, xs[t]), k, softmax_topk);
      std::vector<Vec> per_expert(E);
      for (int e = 0; e < E; ++e) {
        per_expert[e] = VecMat(xs[t], w.v.ptr() + (g * E + e) * d * dh, d, dh);
      }
      if (destination) {
        values[t][g] = per_expert;
      } else {
        Vec v(dh, 0.0);
        for (int i = 0; i < k; ++i) {
          for (int j = 0; j < dh; ++j) {
            v[j] += vroute[t][g].weights[i] * per_expert[vroute[t][g].experts[i]][j];
          }
        }
        values[t][g].push_back(v);
      }
    }
  }
  std::vector<Vec> ys(T, Vec(d, 0.0));
  for (int t = 0; t < T; ++t) {
    std::vector<Vec> heads(H, Vec(dh, 0.0));
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / G);
      Vec p(t + 1);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= t; ++j) {
        p[j] = 0;
        for (int i = 0; i < dh; ++i) p[j] += q[t][h * dh + i] * kk[j][g * dh + i];
        mx = std::max(mx, p[j]);
      }
      for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int j = 0; j <= t; ++j) {
        if (destination) {
          for (int i = 0; i < k; ++i) {
            const double wt = vroute[t][g].weights[i] * p[j] / sum;
            const Vec& v = values[j][g][vroute[t][g].experts[i]];
            for (int x = 0; x < dh; ++x) heads[h][x] += wt * v[x];
          }
        } else {
          for (int x = 0; x < dh; ++x) heads[h][x] += p[j] / sum * values[j][g][0][x];
        }
      }
    }
    if (!routed) {
      Vec cat;
      for (int h = 0; h < H; ++h) {
        const double gate = a.kind == AttentionKind::kSwitchHead
                                ? Sig(MatVec(w.sel_o.ptr() + h * d, 1, d, xs[t])[0])
                                : 1.0;
        for (double v : heads[h]) cat.push_back(gate * v);
      }
      ys[t] = MatVec(w.o.ptr(), d, H * dh, cat);
      continue;
    }
    for (int h = 0; h < H; ++h) {
      const int r = a.shared_router ? 0 : h;
      const Route route = TopK(MatVec(w.sel_o.ptr() + r * E * d, E, d, xs[t]), k, softmax_topk);
      for (int i = 0; i < k; ++i) {
        const Vec y = VecMat(heads[h], w.o.ptr() + (h * E + route.experts[i]) * dh * d, dh, d);
        for (int x = 0; x < d; ++x) ys[t][x] += route.weights[i] * y[x];
      }
    }
  }
  return ys;
}

Vec NaiveExpert(const ModelConfig& c, const FfnWeights& w, int e, const Vec& x) {
  const int d = c.d_model, F = c.ffn.d_ff;
  Vec h = MatVec(w.w1.ptr() + e * F * d, F, d, x);
  for (int i = 0; i < F; ++i)
    h[i] = Act(c.ffn.activation, h[i] + (w.b1.empty() ? 0 : w.b1.data[e * F + i]));
  Vec y = MatVec(w.w2.ptr() + e * d * F, d, F, h);
  for (int i = 0; i < d; ++i) y[i] += w.b2.empty() ? 0 : w.b2.data[e * d + i];
  return y;
}

Vec NaiveFfn(const ModelConfig& c, const FfnWeights& w, const Vec& x) {
  const FfnConfig& f = c.ffn;
  if (f.kind == FfnKind::kDense) return NaiveExpert(c, w, 0, x);
  Vec z = MatVec(w.router_w.ptr(), f.n_experts, c.d_model, x);
  Vec p(f.n_experts);
  double mx = *std::max_element(z.begin(), z.end()), sum = 0;
  for (int e = 0; e < f.n_experts; ++e) {
    z[e] += w.router_b.empty() ? 0 : w.router_b.data[e];
  }
  mx = *std::max_element(z.begin(), z.end());
  for (int e = 0; e < f.n_experts; ++e) sum += std::exp(z[e] - mx);
  for (int e = 0; e < f.n_experts; ++e) {
    p[e] = f.gate == FfnGate::kSoftmax ? std::exp(z[e] - mx) / sum : Sig(z[e]);
  }
  std::vector<int> order(f.n_experts);
  for (int e = 0; e < f.n_experts; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double ksum = 0;
  for (int i = 0; i < f.top_k; ++i) ksum += p[order[i]];
  Vec y(c.d_model, 0.0);
  for (int i = 0; i < f.top_k; ++i) {
    const double g = f.renormalize ? p[order[i]] / ksum : p[order[i]];
    const Vec ye = NaiveExpert(c, w, order[i], x);
    for (int j = 0; j < c.d_model; ++j) y[j] += g * ye[j];
  }
  return y;
}

std::vector<float> NaiveLogits(const ModelConfig& c, const ModelWeights& w,
                               const std::vector<int32_t>& tokens) {
  const int T = static_cast<int>(tokens.size()), d = c.d_model;
  std::vector<Vec> x(T);
  for (int t = 0; t < T; ++t) {
    x[t].assign(w.embedding.ptr() + tokens[t] * d, w.embedding.ptr() + (tokens[t] + 1) * d);
  }
  for (const LayerWeights& layer : w.layers) {
    std::vector<Vec> xn(T);
    for (int t = 0; t < T; ++t) xn[t] = Norm(c, x[t], layer.attn_norm_w, layer.attn_norm_b);
    const std::vector<Vec> y = NaiveAttention(c, layer.attn, xn);
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < d; ++i) x[t][i] += y[t][i];
      const Vec f = NaiveFfn(c, layer.ffn, Norm(c, x[t], layer.ffn_norm_w, layer.ffn_norm_b));
      for (int i = 0; i < d; ++i) x[t][i] += f[i];
    }
  }
  std::vector<float> logits;
  for (int t = 0; t < T; ++t) {
    const Vec l = MatVec(w.OutputHead().ptr(), c.vocab_size, d,
                         Norm(c, x[t], w.final_norm_w, w.final_norm_b));
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

TEST_P(CpuBackendVariantTest, MatchesNaiveReference) {
  const ModelConfig config = GetParam().config;
  const ModelWeights weights = RandomWeights(config, 13);
  // 70 tokens: more than one query tile of the GEMM attention.
  const std::vector<int32_t> tokens = RandomTokens(70, config.vocab_size, 51);
  Harness h(config, weights, config.dispatch);
  const std::vector<float> got = h.Run(1, tokens, 0);
  EXPECT_LE(RelError(got, NaiveLogits(config, weights, tokens)), 1e-4);
  // And decoding a few more tokens one by one after it.
  const std::vector<int32_t> more = RandomTokens(3, config.vocab_size, 52);
  std::vector<int32_t> all = tokens;
  all.insert(all.end(), more.begin(), more.end());
  const std::vector<float> want = NaiveLogits(config, weights, all);
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> row = h.Run(1, {more[i]}, 70 + i);
    EXPECT_LE(RelError(row, Slice(want, 70 + i, config.vocab_size)), 1e-4) << "decode " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, CpuBackendVariantTest, ::testing::ValuesIn(AllVariantConfigs()),
                         [](const ::testing::TestParamInfo<NamedConfig>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
}  // namespace switchserve
