// Paged attention (kernels/cuda/attention.h) against a float64 reference
// over shuffled block tables: GQA groups, head_dim 112, several key segments,
// destination value routing, XL relative positions, bf16 and f32 caches; and
// the invariance it is built for: a query's output is bitwise the same
// attended alone (decode) or inside any prefill tile.
#include "kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using cuda::AttentionArgs;
using cuda::AttentionShape;
using cuda::CacheType;

// Two sequences in one step: `lengths[s]` tokens each, all positions new
// (prefill from 0), or only the last `chunk[s]` of them new.
struct Case {
  AttentionShape shape;
  std::vector<int> lengths;  // context length of each sequence after the step
  std::vector<int> chunk;    // tokens of each sequence in the step
  bool xl = false;           // XL relative positions
};

struct StepLayout {
  std::vector<int32_t> positions, token_sequence, block_tables, block_offsets = {0};
  int tokens = 0;
  int rows = 0;  // cache rows
};

StepLayout Layout(const Case& c, uint64_t seed) {
  StepLayout s;
  const int B = c.shape.block_size;
  int total_blocks = 0;
  for (int len : c.lengths) total_blocks += (len + B - 1) / B;
  std::vector<int32_t> ids(total_blocks + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  int next = 0;
  for (size_t q = 0; q < c.lengths.size(); ++q) {
    const int blocks = (c.lengths[q] + B - 1) / B;
    for (int b = 0; b < blocks; ++b) s.block_tables.push_back(ids[next++]);
    s.block_offsets.push_back(static_cast<int32_t>(s.block_tables.size()));
    for (int p = c.lengths[q] - c.chunk[q]; p < c.lengths[q]; ++p) {
      s.positions.push_back(p);
      s.token_sequence.push_back(static_cast<int32_t>(q));
    }
  }
  s.tokens = static_cast<int>(s.positions.size());
  s.rows = static_cast<int>(ids.size()) * B;
  return s;
}

// Query tiles of at most `tile` tokens per sequence.
void Tiles(const Case& c, int tile, std::vector<int32_t>* first, std::vector<int32_t>* count) {
  int t = 0;
  for (int n : c.chunk) {
    for (int i = 0; i < n; i += tile) {
      first->push_back(t + i);
      count->push_back(std::min(tile, n - i));
    }
    t += n;
  }
}

struct Data {
  std::vector<float> q, k, v, value_weights;  // k, v as the cache holds them (widened)
  std::vector<__nv_bfloat16> k_bf16, v_bf16;
  std::vector<float> xl_keys;  // [H, positions, dh] when XL
  int xl_positions = 0;
};

Data MakeData(const AttentionShape& s, const StepLayout& layout, bool xl, uint64_t seed) {
  Data d;
  if (xl) {
    d.xl_positions = *std::max_element(layout.positions.begin(), layout.positions.end()) + 1;
    d.xl_keys = RandomFloats(static_cast<size_t>(s.heads) * d.xl_positions * s.head_dim, seed + 4);
  }
  const int H = s.heads, G = s.kv_heads, dh = s.head_dim, ev = s.values_per_kv_head;
  d.q = RandomFloats(static_cast<size_t>(layout.tokens) * H * dh, seed, -1.5f, 1.5f);
  d.k = RandomFloats(static_cast<size_t>(layout.rows) * G * dh, seed + 1, -1.5f, 1.5f);
  d.v = RandomFloats(static_cast<size_t>(layout.rows) * G * ev * dh, seed + 2);
  if (s.cache_type == CacheType::kBf16) {
    d.k_bf16 = ToBf16(d.k);
    d.v_bf16 = ToBf16(d.v);
    d.k = Widen(d.k_bf16);
    d.v = Widen(d.v_bf16);
  }
  if (ev > 1) {
    d.value_weights = RandomFloats(static_cast<size_t>(layout.tokens) * G * ev, seed + 3, 0, 1);
    for (size_t i = 0; i < d.value_weights.size(); i += 3) d.value_weights[i] = 0;  // unchosen
  }
  return d;
}

// Runs the kernels with query tiles of `tile` tokens; [T, H * dh].
std::vector<float> Attend(const AttentionShape& s, const Case& c, const StepLayout& layout,
                          const Data& data, int tile) {
  const int H = s.heads, dh = s.head_dim;
  const int max_len = *std::max_element(c.lengths.begin(), c.lengths.end());
  const int segments = (max_len - 1) / s.segment_tokens + 1;
  std::vector<int32_t> first, count;
  Tiles(c, tile, &first, &count);
  DeviceArray<float> q(data.q),
      weights(data.value_weights.empty() ? std::vector<float>{0} : data.value_weights);
  DeviceArray<float> xl_keys(data.xl_keys.empty() ? std::vector<float>{0} : data.xl_keys);
  DeviceArray<float> partials(static_cast<size_t>(layout.tokens) * H * (segments + 1) * (dh + 2));
  DeviceArray<float> out(static_cast<size_t>(layout.tokens) * H * dh);
  DeviceArray<int32_t> positions(layout.positions), sequence(layout.token_sequence),
      tables(layout.block_tables), offsets(layout.block_offsets), d_first(first), d_count(count);
  std::unique_ptr<DeviceArray<float>> k32, v32;
  std::unique_ptr<DeviceArray<__nv_bfloat16>> k16, v16;
  const void *k_cache, *v_cache;
  if (s.cache_type == CacheType::kBf16) {
    k16 = std::make_unique<DeviceArray<__nv_bfloat16>>(data.k_bf16);
    v16 = std::make_unique<DeviceArray<__nv_bfloat16>>(data.v_bf16);
    k_cache = k16->get();
    v_cache = v16->get();
  } else {
    k32 = std::make_unique<DeviceArray<float>>(data.k);
    v32 = std::make_unique<DeviceArray<float>>(data.v);
    k_cache = k32->get();
    v_cache = v32->get();
  }
  AttentionArgs a;
  a.shape = s;
  a.query_tile = tile;
  a.q = q.get();
  a.q_ld = static_cast<int64_t>(H) * dh;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.value_weights = data.value_weights.empty() ? nullptr : weights.get();
  if (!data.xl_keys.empty()) {
    a.xl_keys = xl_keys.get();
    a.xl_positions = data.xl_positions;
  }
  a.positions = positions.get();
  a.token_sequence = sequence.get();
  a.block_tables = tables.get();
  a.block_offsets = offsets.get();
  a.tokens = layout.tokens;
  a.tile_first = d_first.get();
  a.tile_count = d_count.get();
  a.tiles = static_cast<int>(first.size());
  a.segments = segments;
  a.max_segments = segments + 1;
  a.partials = partials.get();
  a.out = out.get();
  a.out_ld = static_cast<int64_t>(H) * dh;
  EXPECT_EQ(cuda::LaunchAttention(a, nullptr), cudaSuccess);
  return out.Download();
}

std::vector<double> Reference(const AttentionShape& s, const StepLayout& layout, const Data& d) {
  const int H = s.heads, G = s.kv_heads, dh = s.head_dim, ev = s.values_per_kv_head;
  const int B = s.block_size, group = H / G;
  std::vector<double> out(static_cast<size_t>(layout.tokens) * H * dh);
  for (int t = 0; t < layout.tokens; ++t) {
    const int seq = layout.token_sequence[t];
    const int32_t* table = layout.block_tables.data() + layout.block_offsets[seq];
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      const int n = layout.positions[t] + 1;
      std::vector<double> score(n);
      double top = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const int64_t row = static_cast<int64_t>(table[j / B]) * B + j % B;
        double sdot = 0;
        for (int i = 0; i < dh; ++i) {
          sdot += static_cast<double>(d.q[(static_cast<int64_t>(t) * H + h) * dh + i]) *
                  d.k[(row * G + g) * dh + i];
        }
        if (!d.xl_keys.empty()) {  // + q . R_h[i - j]
          const int64_t delta = layout.positions[t] - j;
          for (int i = 0; i < dh; ++i) {
            sdot += static_cast<double>(d.q[(static_cast<int64_t>(t) * H + h) * dh + i]) *
                    d.xl_keys[(h * static_cast<int64_t>(d.xl_positions) + delta) * dh + i];
          }
        }
        score[j] = sdot;
        top = std::max(top, sdot);
      }
      double total = 0;
      for (double& sj : score) total += (sj = std::exp(sj - top));
      for (int i = 0; i < dh; ++i) {
        double acc = 0;
        for (int j = 0; j < n; ++j) {
          const int64_t row = static_cast<int64_t>(table[j / B]) * B + j % B;
          double value = 0;
          for (int e = 0; e < ev; ++e) {
            const double w =
                ev == 1 ? 1.0 : d.value_weights[(static_cast<int64_t>(t) * G + g) * ev + e];
            if (w == 0) continue;  // an unchosen expert, skipped as on the CPU
            value += w * d.v[((row * G + g) * ev + e) * dh + i];
          }
          acc += score[j] / total * value;
        }
        out[(static_cast<int64_t>(t) * H + h) * dh + i] = acc;
      }
    }
  }
  return out;
}

AttentionShape Shape(int H, int G, int dh, int ev, int B, int segment, CacheType cache) {
  AttentionShape s;
  s.heads = H;
  s.kv_heads = G;
  s.head_dim = dh;
  s.values_per_kv_head = ev;
  s.block_size = B;
  s.segment_tokens = segment;
  s.cache_type = cache;
  return s;
}

std::string Describe(const Case& c) {
  const AttentionShape& s = c.shape;
  return std::string(c.xl ? "XL " : "") + "H=" + std::to_string(s.heads) +
         " G=" + std::to_string(s.kv_heads) + " dh=" + std::to_string(s.head_dim) +
         " Ev=" + std::to_string(s.values_per_kv_head) + " B=" + std::to_string(s.block_size) +
         " L=" + std::to_string(s.segment_tokens) +
         (s.cache_type == CacheType::kBf16 ? " bf16" : " f32");
}

const std::vector<Case>& Cases() {
  static const std::vector<Case>* cases = new std::vector<Case>{
      {Shape(4, 4, 8, 1, 4, 8, CacheType::kF32), {19, 7}, {19, 7}},
      {Shape(4, 2, 112, 1, 16, 32, CacheType::kBf16), {70, 33}, {70, 1}},
      {Shape(8, 2, 24, 1, 4, 12, CacheType::kF32), {33, 40}, {13, 40}},
      {Shape(2, 2, 16, 4, 4, 16, CacheType::kBf16), {25, 9}, {25, 9}},
      {Shape(4, 1, 256, 1, 8, 16, CacheType::kF32), {20, 3}, {20, 3}},
      {Shape(4, 2, 12, 1, 4, 8, CacheType::kF32), {30, 11}, {30, 2}, /*xl=*/true},
      {Shape(3, 3, 20, 2, 4, 16, CacheType::kBf16), {21, 9}, {21, 9}, /*xl=*/true},
      // KV blocks of more units than the kernel holds in registers while it
      // computes the previous block: 16-byte units (f32), single elements (bf16, dh 20).
      {Shape(2, 1, 128, 4, 16, 32, CacheType::kF32), {40, 9}, {40, 1}},
      {Shape(2, 2, 20, 4, 16, 32, CacheType::kBf16), {37, 18}, {37, 18}},
  };
  return *cases;
}

TEST(SimtAttention, MatchesFloat64OverShuffledBlockTables) {
  SIMT_REQUIRE_DEVICE();
  int n = 0;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Describe(c));
    const StepLayout layout = Layout(c, 100 + n);
    const Data data = MakeData(c.shape, layout, c.xl, 200 + 10 * n++);
    const std::vector<double> want = Reference(c.shape, layout, data);
    const int tile = cuda::AttentionQueryTile(c.shape, 48 * 1024);
    const std::vector<float> got =
        InEveryOrder([&] { return Attend(c.shape, c, layout, data, tile); });
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

// Tiles of 1 (every query alone, as in decode), 3 and the largest that fits:
// bitwise the same output.
TEST(SimtAttention, AQuerysOutputDoesNotDependOnItsTile) {
  SIMT_REQUIRE_DEVICE();
  int n = 0;
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Describe(c));
    const StepLayout layout = Layout(c, 300 + n);
    const Data data = MakeData(c.shape, layout, c.xl, 400 + 10 * n++);
    const std::vector<float> alone = Attend(c.shape, c, layout, data, 1);
    for (const int tile : {3, cuda::AttentionQueryTile(c.shape, 48 * 1024)}) {
      const std::vector<float> tiled = Attend(c.shape, c, layout, data, tile);
      ASSERT_EQ(tiled.size(), alone.size());
      EXPECT_EQ(std::memcmp(tiled.data(), alone.data(), alone.size() * sizeof(float)), 0)
          << "tile " << tile;
    }
  }
}

// got against the float64 reference, NaN where it is NaN.
void ExpectNearReference(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << "element " << i << " is " << got[i];
    } else {
      ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

// Keys whose score is -inf (q . k overflowing to -inf): weight 0, as the
// CPU's exp(s - max) over all of a row's keys gives them. Here the first KV
// block of every segment and all of the second segment hold such keys, so a
// segment's online softmax meets blocks, and whole segments, of -inf scores
// before (or without) a finite one; the rows whose every key is -inf are NaN
// as on the CPU (max -inf, exp(-inf - -inf)).
TEST(SimtAttention, KeysScoringMinusInfinityWeighNothing) {
  SIMT_REQUIRE_DEVICE();
  for (const CacheType cache : {CacheType::kF32, CacheType::kBf16}) {
    const Case c{Shape(4, 2, 8, 1, 4, 8, cache), {27, 9}, {27, 9}};
    SCOPED_TRACE(Describe(c));
    const StepLayout layout = Layout(c, 77);
    Data data = MakeData(c.shape, layout, /*xl=*/false, 78);
    // Positive queries, and keys of -inf: every such key's score is -inf.
    for (float& q : data.q) q = std::fabs(q) + 0.25f;
    const AttentionShape& s = c.shape;
    const int B = s.block_size, G = s.kv_heads, dh = s.head_dim;
    for (size_t seq = 0; seq < c.lengths.size(); ++seq) {
      const int32_t* table = layout.block_tables.data() + layout.block_offsets[seq];
      for (int j = 0; j < c.lengths[seq]; ++j) {
        if (j % s.segment_tokens >= B && j / s.segment_tokens != 1) continue;
        const int64_t row = static_cast<int64_t>(table[j / B]) * B + j % B;
        for (int i = 0; i < G * dh; ++i) {
          data.k[row * G * dh + i] = -INFINITY;
          if (cache == CacheType::kBf16) {
            data.k_bf16[row * G * dh + i] = __float2bfloat16_rn(-INFINITY);
          }
        }
      }
    }
    const std::vector<double> want = Reference(s, layout, data);
    int finite = 0;
    for (const double w : want) finite += std::isfinite(w) ? 1 : 0;
    ASSERT_GT(finite, 0);
    ASSERT_LT(finite, static_cast<int>(want.size()));  // the first rows see only -inf keys
    const int tile = cuda::AttentionQueryTile(s, 48 * 1024);
    ExpectNearReference(InEveryOrder([&] { return Attend(s, c, layout, data, tile); }), want);
    ExpectNearReference(Attend(s, c, layout, data, 1), want);
  }
}

// Destination value routing: an expert a query did not choose (gate 0) adds
// nothing to its values, as on the CPU, even where the cache holds inf for
// it (0 * inf would be NaN).
TEST(SimtAttention, AnUnchosenExpertsValuesAreSkipped) {
  SIMT_REQUIRE_DEVICE();
  for (const CacheType cache : {CacheType::kF32, CacheType::kBf16}) {
    const Case c{Shape(2, 2, 16, 4, 4, 16, cache), {25, 9}, {25, 9}};
    SCOPED_TRACE(Describe(c));
    const StepLayout layout = Layout(c, 55);
    Data data = MakeData(c.shape, layout, /*xl=*/false, 56);
    const AttentionShape& s = c.shape;
    const int G = s.kv_heads, ev = s.values_per_kv_head, dh = s.head_dim;
    constexpr int kUnchosen = 1;  // no query's choice: gate 0, values inf
    for (int t = 0; t < layout.tokens; ++t) {
      for (int g = 0; g < G; ++g) {
        data.value_weights[(static_cast<size_t>(t) * G + g) * ev + kUnchosen] = 0.0f;
      }
    }
    for (int row = 0; row < layout.rows; ++row) {
      for (int g = 0; g < G; ++g) {
        for (int i = 0; i < dh; ++i) {
          const size_t at = ((static_cast<size_t>(row) * G + g) * ev + kUnchosen) * dh + i;
          data.v[at] = INFINITY;
          if (cache == CacheType::kBf16) data.v_bf16[at] = __float2bfloat16_rn(INFINITY);
        }
      }
    }
    const std::vector<double> want = Reference(s, layout, data);
    for (const double w : want) ASSERT_TRUE(std::isfinite(w));
    const int tile = cuda::AttentionQueryTile(s, 48 * 1024);
    ExpectNearReference(InEveryOrder([&] { return Attend(s, c, layout, data, tile); }), want);
  }
}

TEST(SimtAttention, RejectsShapesItCannotRun) {
  SIMT_REQUIRE_DEVICE();
  AttentionArgs a;
  a.shape = Shape(3, 2, 8, 1, 4, 8, CacheType::kF32);  // H not a multiple of G
  EXPECT_EQ(cuda::LaunchAttention(a, nullptr), cudaErrorInvalidValue);
  a.shape = Shape(2, 2, 8, 1, 4, 6, CacheType::kF32);  // segment not whole blocks
  EXPECT_EQ(cuda::LaunchAttention(a, nullptr), cudaErrorInvalidValue);
  a.shape = Shape(2, 2, 300, 1, 4, 8, CacheType::kF32);  // head_dim > 256
  EXPECT_EQ(cuda::LaunchAttention(a, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

}  // namespace
}  // namespace switchserve::simt_test
