// Paged attention: segment kernel (one block per query tile, KV head and key
// segment) and merge kernel (one block per token). Every sum below runs in a
// fixed order that depends on the query alone:
//   score(j)  = fmaf chain over the head dimension;
//   per KV block: m' = max(m, max_j score), alpha = exp(m - m'),
//             p_j = exp(score_j - m'), l = l * alpha + (p_0 + p_1 + ...),
//             acc = acc * alpha, then acc = fmaf(p_j, v_j, acc) for j in order
//             (p_j = 0 for a score of -inf, alpha = 1 while m' is -inf;
//             v_j sums only the experts of nonzero gate);
//   merge:    M = max_s m_s, l = sum_s l_s exp(m_s - M), out = (sum_s acc_s
//             exp(m_s - M)) / l, in segment order.
// A segment block stages one KV block at a time into shared memory with
// 16-byte loads, and issues the next block's loads before computing the
// current one (KvStage), so that a decode step's walk along its context waits
// on memory about once rather than once per KV block.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/widen.h"

namespace switchserve::cuda {
namespace {

constexpr int kThreads = 256;

// One KV block's keys and values, from the cache into shared memory as
// floats, in units of kUnit cache elements: 16-byte loads (kUnit = 16 /
// sizeof(CacheT)) where every cache row starts 16-byte aligned and the head
// dimension is whole units, single elements otherwise. Units run keys first
// (n x dh), then values (n x ev * dh). A thread holds up to kHeld units in
// registers: Load issues them for the next block while the current one is
// being computed, and Store widens them into shared memory (loading and
// storing any units beyond them directly). Staging order never touches the
// arithmetic.
template <typename CacheT, int kUnit>
struct KvStage {
  using Raw = std::conditional_t<kUnit == 1, CacheT, uint4>;
  // 5 x 256 threads cover the paper shape's KV block (1,120 16-byte units:
  // 16 keys of 112 bf16, their 4 x 112 values); 8 cost 177 registers a thread,
  // one block per SM, and 12% on a 2048-token prefill (H100).
  static constexpr int kHeld = 5;

  const CacheT* k_src;  // the block's first key row, this KV head's columns
  const CacheT* v_src;
  int64_t k_ld, v_ld;    // cache row strides (elements)
  int k_width, v_width;  // dh, ev * dh
  int n;                 // keys in the block
  Raw held[kHeld];

  __device__ __forceinline__ int Units() const { return n * (k_width + v_width) / kUnit; }

  __device__ __forceinline__ const CacheT* Source(int u) const {
    const int k_units = n * k_width / kUnit;
    if (u < k_units) {
      const int per_row = k_width / kUnit;
      return k_src + (u / per_row) * k_ld + (u % per_row) * kUnit;
    }
    u -= k_units;
    const int per_row = v_width / kUnit;
    return v_src + (u / per_row) * v_ld + (u % per_row) * kUnit;
  }

  __device__ __forceinline__ float* Destination(int u, float* k_blk, float* v_blk) const {
    const int k_units = n * k_width / kUnit;
    return u < k_units ? k_blk + u * kUnit : v_blk + (u - k_units) * kUnit;
  }

  __device__ __forceinline__ static Raw LoadUnit(const CacheT* p) {
    return *reinterpret_cast<const Raw*>(p);
  }

  __device__ __forceinline__ static void StoreUnit(const Raw& raw, float* dst) {
    if constexpr (kUnit == 1) {
      dst[0] = Widen(raw);
    } else {
      WidenWords<CacheT>(raw, dst);
    }
  }

  __device__ __forceinline__ void Load() {
    const int total = Units();
    SIMT_UNROLL
    for (int i = 0; i < kHeld; ++i) {
      const int u = static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x);
      if (u < total) held[i] = LoadUnit(Source(u));
    }
  }

  __device__ __forceinline__ void Store(float* k_blk, float* v_blk) const {
    const int total = Units();
    SIMT_UNROLL
    for (int i = 0; i < kHeld; ++i) {
      const int u = static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x);
      if (u < total) StoreUnit(held[i], Destination(u, k_blk, v_blk));
    }
    for (int u = static_cast<int>(threadIdx.x) + kHeld * static_cast<int>(blockDim.x); u < total;
         u += static_cast<int>(blockDim.x)) {
      StoreUnit(LoadUnit(Source(u)), Destination(u, k_blk, v_blk));
    }
  }
};

// Floats of shared memory: the KV block, then per query row (query, head of
// the group) its query, accumulator, block scores, m, l, alpha; then the
// tile's destination value weights.
size_t SharedFloats(const AttentionShape& s, int tile) {
  const size_t group = static_cast<size_t>(s.heads / s.kv_heads);
  const size_t rows = static_cast<size_t>(tile) * group;
  return static_cast<size_t>(s.block_size) * s.head_dim * (1 + s.values_per_kv_head) +
         rows * (2 * static_cast<size_t>(s.head_dim) + s.block_size + 3) +
         static_cast<size_t>(tile) * s.values_per_kv_head;
}

template <typename CacheT, int kUnit>
__global__ void __launch_bounds__(kThreads)
    AttentionSegmentKernel(const float* q, int64_t q_ld, const CacheT* k_cache,
                           const CacheT* v_cache, const float* value_weights,
                           const int32_t* positions, const int32_t* token_sequence,
                           const int32_t* block_tables, const int32_t* block_offsets,
                           const int32_t* tile_first, const int32_t* tile_count, int heads,
                           int kv_heads, int head_dim, int ev, int block_size, int segment_tokens,
                           int query_tile, int max_segments, const float* xl_keys, int xl_positions,
                           float* partials) {
  SIMT_GRID_WAIT();
  SIMT_DYNAMIC_SHARED(float, smem);
  const int group = heads / kv_heads;
  const int dh = head_dim;
  const int B = block_size;
  const int first = tile_first[blockIdx.x];
  const int count = tile_count[blockIdx.x];
  const int g = blockIdx.y;
  const int seg = blockIdx.z;
  const int key_begin = seg * segment_tokens;
  const int last_position = positions[first + count - 1];
  if (key_begin > last_position) return;  // the whole block, before any barrier
  const int key_end = min(key_begin + segment_tokens, last_position + 1);
  const int32_t* table = block_tables + block_offsets[token_sequence[first]];
  const int rows = count * group;  // query rows: row = i * group + hq
  const int tile_rows = query_tile * group;

  float* k_blk = smem;                                     // [B, dh]
  float* v_blk = k_blk + static_cast<int64_t>(B) * dh;     // [B, ev * dh]
  float* qs = v_blk + static_cast<int64_t>(B) * ev * dh;   // [rows, dh]
  float* acc = qs + static_cast<int64_t>(tile_rows) * dh;  // [rows, dh]
  float* sc = acc + static_cast<int64_t>(tile_rows) * dh;  // [rows, B]
  float* m = sc + static_cast<int64_t>(tile_rows) * B;     // [rows]
  float* l = m + tile_rows;                                // [rows]
  float* alpha = l + tile_rows;                            // [rows]
  float* vw = alpha + tile_rows;                           // [count, ev]

  for (int idx = threadIdx.x; idx < rows * dh; idx += blockDim.x) {
    const int row = idx / dh;
    const int i = row / group;
    const int h = g * group + row % group;
    qs[idx] = q[static_cast<int64_t>(first + i) * q_ld + static_cast<int64_t>(h) * dh + idx % dh];
    acc[idx] = 0.0f;
  }
  for (int row = threadIdx.x; row < rows; row += blockDim.x) {
    m[row] = -INFINITY;
    l[row] = 0.0f;
  }
  if (ev > 1) {
    for (int idx = threadIdx.x; idx < count * ev; idx += blockDim.x) {
      const int64_t t = first + idx / ev;
      vw[idx] = value_weights[(t * kv_heads + g) * ev + idx % ev];
    }
  }
  __syncthreads();

  const int64_t k_row = static_cast<int64_t>(kv_heads) * dh;
  const int64_t v_row = k_row * ev;
  // The KV block at key kb, its loads issued (and held in registers).
  KvStage<CacheT, kUnit> stage;
  stage.k_ld = k_row;
  stage.v_ld = v_row;
  stage.k_width = dh;
  stage.v_width = ev * dh;
  const auto issue = [&](int kb) {
    const int64_t row0 = static_cast<int64_t>(table[kb / B]) * B;
    stage.k_src = k_cache + row0 * k_row + static_cast<int64_t>(g) * dh;
    stage.v_src = v_cache + row0 * v_row + static_cast<int64_t>(g) * ev * dh;
    stage.n = min(B, key_end - kb);
    stage.Load();
  };
  issue(key_begin);
  for (int kb = key_begin; kb < key_end; kb += B) {
    const int n_keys = min(B, key_end - kb);
    stage.Store(k_blk, v_blk);
    __syncthreads();
    // The next block's loads are in flight while this one is computed.
    if (kb + B < key_end) issue(kb + B);
    // Scores of the keys each query sees in this block.
    for (int idx = threadIdx.x; idx < rows * B; idx += blockDim.x) {
      const int row = idx / B;
      const int j = idx % B;
      const int visible = min(n_keys, positions[first + row / group] - kb + 1);
      if (j >= visible) continue;
      const float* qr = qs + static_cast<int64_t>(row) * dh;
      const float* kj = k_blk + static_cast<int64_t>(j) * dh;
      float s = 0.0f;
      for (int d = 0; d < dh; ++d) s = fmaf(qr[d], kj[d], s);
      if (xl_keys != nullptr) {
        // + q . R_h[i - j]
        const int64_t h = static_cast<int64_t>(g) * group + row % group;
        const int delta = positions[first + row / group] - (kb + j);
        const float* rel = xl_keys + (h * xl_positions + delta) * dh;
        float position = 0.0f;
        for (int d = 0; d < dh; ++d) position = fmaf(qr[d], rel[d], position);
        s += position;
      }
      sc[idx] = s;
    }
    __syncthreads();
    // Online softmax: the block's maximum, rescale, probabilities.
    for (int row = threadIdx.x; row < rows; row += blockDim.x) {
      const int visible = min(n_keys, positions[first + row / group] - kb + 1);
      if (visible <= 0) continue;
      float* sr = sc + static_cast<int64_t>(row) * B;
      float block_max = sr[0];
      for (int j = 1; j < visible; ++j) block_max = fmaxf(block_max, sr[j]);
      const float m_new = fmaxf(m[row], block_max);
      // A key scoring -inf weighs 0, as under the maximum of all the row's
      // keys, also while every score so far is -inf (m' = -inf, where
      // exp(-inf - -inf) would be NaN): such a block adds 0 to l.
      const float a = m_new == -INFINITY ? 1.0f : expf(m[row] - m_new);
      float sum = 0.0f;
      for (int j = 0; j < visible; ++j) {
        const float p = sr[j] == -INFINITY ? 0.0f : expf(sr[j] - m_new);
        sr[j] = p;
        sum += p;
      }
      l[row] = l[row] * a + sum;
      m[row] = m_new;
      alpha[row] = a;
    }
    __syncthreads();
    // acc = acc * alpha + sum_j p_j v_j.
    for (int idx = threadIdx.x; idx < rows * dh; idx += blockDim.x) {
      const int row = idx / dh;
      const int d = idx % dh;
      const int i = row / group;
      const int visible = min(n_keys, positions[first + i] - kb + 1);
      if (visible <= 0) continue;
      const float* pr = sc + static_cast<int64_t>(row) * B;
      float v = acc[idx] * alpha[row];
      for (int j = 0; j < visible; ++j) {
        float value;
        if (ev == 1) {
          value = v_blk[static_cast<int64_t>(j) * dh + d];
        } else {
          value = 0.0f;
          const float* vj = v_blk + static_cast<int64_t>(j) * ev * dh + d;
          for (int e = 0; e < ev; ++e) {
            // An expert the query did not choose adds nothing (0 * inf is NaN).
            if (vw[i * ev + e] != 0.0f) value = fmaf(vw[i * ev + e], vj[e * dh], value);
          }
        }
        v = fmaf(pr[j], value, v);
      }
      acc[idx] = v;
    }
    __syncthreads();
  }

  const int width = dh + 2;
  for (int idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int row = idx / width;
    const int c = idx % width;
    const int i = row / group;
    if (positions[first + i] < key_begin) continue;  // its context ends before this segment
    const int64_t h = static_cast<int64_t>(g) * group + row % group;
    float* dst = partials + (((first + i) * heads + h) * max_segments + seg) * width;
    dst[c] = c == 0 ? m[row] : c == 1 ? l[row] : acc[static_cast<int64_t>(row) * dh + c - 2];
  }
}

__global__ void __launch_bounds__(kThreads)
    AttentionMergeKernel(const float* partials, const int32_t* positions, int heads, int head_dim,
                         int segment_tokens, int max_segments, float* out, int64_t out_ld) {
  SIMT_GRID_WAIT();
  const int64_t t = blockIdx.x;
  const int segments = positions[t] / segment_tokens + 1;
  const int width = head_dim + 2;
  for (int idx = threadIdx.x; idx < heads * head_dim; idx += blockDim.x) {
    const int64_t h = idx / head_dim;
    const int d = idx % head_dim;
    const float* part = partials + (t * heads + h) * max_segments * width;
    float top = part[0];
    for (int s = 1; s < segments; ++s) top = fmaxf(top, part[s * width]);
    float l = 0.0f, a = 0.0f;
    for (int s = 0; s < segments; ++s) {
      const float w = expf(part[s * width] - top);
      l = fmaf(part[s * width + 1], w, l);
      a = fmaf(part[s * width + 2 + d], w, a);
    }
    out[t * out_ld + idx] = a / l;
  }
}

template <typename CacheT, int kUnit>
cudaError_t LaunchSegments(const AttentionArgs& a, size_t shared_bytes, cudaStream_t stream) {
  if (const cudaError_t e =
          simt::AllowDynamicShared(AttentionSegmentKernel<CacheT, kUnit>, shared_bytes);
      e != cudaSuccess) {
    return e;
  }
  const AttentionShape& s = a.shape;
  return SIMT_LAUNCH_DEPENDENT(
      (AttentionSegmentKernel<CacheT, kUnit>), dim3(a.tiles, s.kv_heads, a.segments),
      dim3(kThreads), shared_bytes, stream, a.q, a.q_ld, static_cast<const CacheT*>(a.k_cache),
      static_cast<const CacheT*>(a.v_cache), a.value_weights, a.positions, a.token_sequence,
      a.block_tables, a.block_offsets, a.tile_first, a.tile_count, s.heads, s.kv_heads, s.head_dim,
      s.values_per_kv_head, s.block_size, s.segment_tokens, a.query_tile, a.max_segments, a.xl_keys,
      a.xl_positions, a.partials);
}

// 16-byte loads when every row of both caches starts 16-byte aligned.
template <typename CacheT>
cudaError_t LaunchSegments(const AttentionArgs& a, size_t shared_bytes, cudaStream_t stream) {
  constexpr int kVector = 16 / sizeof(CacheT);
  const bool aligned = a.shape.head_dim % kVector == 0 &&
                       reinterpret_cast<uintptr_t>(a.k_cache) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(a.v_cache) % 16 == 0;
  return aligned ? LaunchSegments<CacheT, kVector>(a, shared_bytes, stream)
                 : LaunchSegments<CacheT, 1>(a, shared_bytes, stream);
}

}  // namespace

size_t AttentionSharedBytes(const AttentionShape& shape, int query_tile) {
  return SharedFloats(shape, query_tile) * sizeof(float);
}

int AttentionMaxBlockSize(const AttentionShape& shape, size_t shared_bytes) {
  // Every token of a block adds at least one float: a block of
  // shared_bytes / 4 + 1 tokens never fits. Bisect below it.
  AttentionShape s = shape;
  int fits = 0;
  int fails = static_cast<int>(std::min<size_t>(shared_bytes / sizeof(float), INT_MAX - 1)) + 1;
  while (fails - fits > 1) {
    const int mid = fits + (fails - fits) / 2;
    s.block_size = mid;
    if (AttentionSharedBytes(s, 1) <= shared_bytes) {
      fits = mid;
    } else {
      fails = mid;
    }
  }
  return fits;
}

int AttentionQueryTile(const AttentionShape& shape, size_t shared_bytes) {
  constexpr int kMaxTile = 32;
  int tile = 1;
  while (tile < kMaxTile && AttentionSharedBytes(shape, tile + 1) <= shared_bytes) ++tile;
  return tile;
}

cudaError_t LaunchAttention(const AttentionArgs& a, cudaStream_t stream) {
  const AttentionShape& s = a.shape;
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0 || s.head_dim < 1 || s.head_dim > 256 ||
      s.block_size < 1 || s.segment_tokens < s.block_size || s.segment_tokens % s.block_size != 0 ||
      a.query_tile < 1 || a.segments < 1 || a.segments > a.max_segments ||
      (s.values_per_kv_head > 1 && a.value_weights == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.tokens == 0) return cudaSuccess;
  const size_t shared_bytes = AttentionSharedBytes(s, a.query_tile);
  const cudaError_t e = s.cache_type == CacheType::kBf16
                            ? LaunchSegments<__nv_bfloat16>(a, shared_bytes, stream)
                            : LaunchSegments<float>(a, shared_bytes, stream);
  if (e != cudaSuccess) return e;
  return SIMT_LAUNCH_DEPENDENT(AttentionMergeKernel, dim3(a.tokens), dim3(kThreads), 0, stream,
                               a.partials, a.positions, s.heads, s.head_dim, s.segment_tokens,
                               a.max_segments, a.out, a.out_ld);
}

}  // namespace switchserve::cuda
