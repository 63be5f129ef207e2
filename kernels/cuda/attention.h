// Causal attention over the paged KV cache, for decode and prefill alike.
//
// One definition of a query's attention, whatever the step around it: the
// query at position p sees keys 0..p of its sequence, read through its block
// table. Keys split into segments of `segment_tokens` positions (a whole
// number of KV blocks: [0, L), [L, 2L), ...); within a segment the keys are
// taken KV block by KV block in order, with an online softmax in f32 (block
// maximum, rescale, then the block's keys one by one); the segments' partial
// results (max, sum, weighted values) are merged in segment order. Segments
// run in parallel (split-K along long contexts) but where they split depends
// only on p, and every sum has a fixed order, so a query's result is bitwise
// the same in a decode step, in any prefill chunk, and beside any neighbours.
//
// A block of LaunchAttention computes one segment for a tile of consecutive
// queries of one sequence (prefill: up to a few dozen; decode: one) and one
// KV head: each KV block is loaded once into shared memory and used by every
// query of the tile and every query head of the KV head's group (GQA). The
// tile size only decides which block computes a query, never how.
//
// Destination value routing: values are cached per expert ([G, E, dh] per
// token) and the query's gates weight them: the value of key j is
// sum_e weight[t, g, e] * v[j, g, e].
//
// XL relative positions (xl_positions.h): the score of query position i and
// key position j gains q_h . R_h[i - j], its own fmaf chain over the head
// dimension, added to the content score.
#ifndef SWITCHSERVE_KERNELS_CUDA_ATTENTION_H_
#define SWITCHSERVE_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/step_ops.h"

namespace switchserve::cuda {

struct AttentionShape {
  int heads = 1;               // H query heads
  int kv_heads = 1;            // G; H % G == 0
  int head_dim = 1;            // any, up to 256 (112 included)
  int values_per_kv_head = 1;  // 1, or E with destination value routing
  int block_size = 1;          // tokens per KV block
  int segment_tokens = 1;      // a multiple of block_size
  CacheType cache_type = CacheType::kBf16;
};

// The largest query tile for `shape` whose shared memory fits in
// `shared_bytes`; at least 1 (then SharedBytes(shape, 1) may exceed it).
int AttentionQueryTile(const AttentionShape& shape, size_t shared_bytes);
// Dynamic shared memory of one block with `query_tile` queries.
size_t AttentionSharedBytes(const AttentionShape& shape, int query_tile);
// The largest KV block size (shape.block_size aside) whose blocks of one
// query fit in `shared_bytes`; 0 when not even a block of one token fits.
// The shared memory grows with the block size: a KV cache with larger blocks
// cannot run its attention.
int AttentionMaxBlockSize(const AttentionShape& shape, size_t shared_bytes);

struct AttentionArgs {
  AttentionShape shape;
  int query_tile = 1;  // as the tiles below were cut
  // Queries: [T, H * head_dim], rows q_ld floats apart (after RoPE, scaled).
  const float* q = nullptr;
  int64_t q_ld = 0;
  // This layer's cache: K [rows, G, head_dim], V [rows, G * Ev, head_dim].
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  // Destination value routing: [T, G, E] gate weights; null otherwise.
  const float* value_weights = nullptr;
  // XL positions: this layer's table [H, xl_positions, dh]; null with RoPE.
  const float* xl_keys = nullptr;
  int xl_positions = 0;
  // The step (engine/runtime/step_batch.h).
  const int32_t* positions = nullptr;
  const int32_t* token_sequence = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* block_offsets = nullptr;
  int tokens = 0;
  // Query tiles: tile i is tokens [tile_first[i], tile_first[i] + tile_count[i]) of one sequence.
  const int32_t* tile_first = nullptr;
  const int32_t* tile_count = nullptr;
  int tiles = 0;
  // Segments launched per tile (the step's longest context / segment_tokens,
  // rounded up, or more); partials holds [T, H, max_segments, head_dim + 2].
  int segments = 1;
  int max_segments = 1;
  float* partials = nullptr;
  // Output: [T, H * head_dim], rows out_ld floats apart.
  float* out = nullptr;
  int64_t out_ld = 0;
};

// The segments' partial results, then their merge into `out`.
cudaError_t LaunchAttention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_ATTENTION_H_
