// Matrix products with a batch-independent reduction order (linear.h): every
// output is the same sum, whichever kernel computes it. Its k range is cut
// into chunks of kChunk; a chunk is one fmaf chain from zero in increasing k,
// and the chunk sums are added to a running total from zero, in increasing k.
//
// Many rows (prefill): a block computes a TM x TN tile of out, staging
// TK-deep slices of a and W in shared memory; each thread owns RM x RN
// outputs (rows ty + i * TY, columns tx + j * TX) and walks k in order,
// closing a chunk every kChunk / kTileK slices.
//
// Few rows (decode) or few columns (routers): a block computes 32 columns for
// up to 8 rows; its 16 warps take 16 chunks at a time (lane = column) and
// write the chunk sums to shared memory, and warp r adds them to row r's
// total in chunk order. So a decode step spreads each matrix over k as well as n.
//
// Both put row blocks (tiles, groups of 8 rows) on the grid's y, which holds
// at most 65,535: a block computes row blocks blockIdx.y, blockIdx.y +
// gridDim.y, ... one after the other, so any number of rows fits one launch.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/linear.h"
#include "kernels/cuda/simt.h"
#include "kernels/cuda/widen.h"

namespace switchserve::cuda {
namespace {

constexpr int kTileK = 16;
constexpr int kChunk = 32;  // a multiple of kTileK
static_assert(kChunk % kTileK == 0, "a chunk is whole tile slices");
// The most blocks along a grid's y. Past that many row blocks a block takes
// several in turn, which changes which block computes a row, never how.
constexpr int kMaxGridY = 65535;

__device__ __forceinline__ float Activate(Activation act, float x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kGelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::kSilu:
      return x / (1.0f + expf(-x));
    case Activation::kNone:
      break;
  }
  return x;
}

// The rows of matrix `mat` (linear.h): all dense rows, or an expert's slots.
struct MatrixRows {
  int head = 0;
  int router = 0;
  int begin = 0;  // first slot
  int count = 0;
};

__device__ __forceinline__ MatrixRows RowsOf(int mat, int dense_rows, const int32_t* offsets,
                                             int n_experts, int shared_router) {
  MatrixRows m;
  m.count = dense_rows;
  if (offsets != nullptr) {
    m.head = mat / n_experts;
    m.router = shared_router != 0 ? 0 : m.head;
    const int32_t* o = offsets + static_cast<int64_t>(m.router) * (n_experts + 1);
    m.begin = o[mat % n_experts];
    m.count = o[mat % n_experts + 1] - m.begin;
  }
  return m;
}

// Where the matrix's row `local` reads a (element offset) and writes out
// (row); -1 for both past its last row.
__device__ __forceinline__ void LocateRow(const MatrixRows& m, int local, const int32_t* offsets,
                                          const int32_t* a_rows, int64_t slot_stride, int64_t lda,
                                          int64_t a_head_cols, int64_t* offset, int64_t* row) {
  *offset = -1;
  *row = -1;
  if (local >= m.count) return;
  if (offsets == nullptr) {
    *offset = static_cast<int64_t>(local) * lda;
    *row = local;
    return;
  }
  const int64_t slot = m.begin + local;
  const int64_t a_row =
      a_rows != nullptr ? a_rows[m.router * slot_stride + slot] : m.head * slot_stride + slot;
  *offset = a_row * lda + m.head * a_head_cols;
  *row = m.head * slot_stride + slot;
}

// The epilogue of one output: scale, bias, activation; stored or added.
__device__ __forceinline__ void Store(float sum, float alpha, const float* bias, Activation act,
                                      int accumulate, float* o, int n) {
  float v = alpha * sum;
  if (bias != nullptr) v += bias[n];
  v = Activate(act, v);
  *o = accumulate != 0 ? *o + v : v;
}

template <typename WT, WeightLayout kLayout, int TY, int TX, int RM, int RN>
__global__ void __launch_bounds__(TY* TX)
    LinearKernel(const float* a, int64_t lda, int dense_rows, const int32_t* offsets,
                 const int32_t* a_rows, int64_t slot_stride, int n_experts, int shared_router,
                 int64_t a_head_cols, int k_dim, const WT* w, int64_t ldw, int64_t w_matrix_stride,
                 int n_cols, float alpha, const float* bias, int64_t bias_stride, Activation act,
                 int accumulate, float* out, int64_t ldc) {
  SIMT_GRID_WAIT();
  constexpr int kThreads = TY * TX;
  constexpr int TM = TY * RM;
  constexpr int TN = TX * RN;
  SIMT_SHARED(float, a_tile, kTileK* TM);  // [kk][m]
  SIMT_SHARED(float, w_tile, kTileK* TN);  // [kk][n]
  SIMT_SHARED(int64_t, a_offset, TM);      // element offset of each tile row in a; -1: none
  SIMT_SHARED(int64_t, out_row, TM);

  const int mat = blockIdx.z;
  const MatrixRows rows_of = RowsOf(mat, dense_rows, offsets, n_experts, shared_router);
  const int row_count = rows_of.count;
  const int n0 = blockIdx.x * TN;
  const int tid = threadIdx.x;
  const int tx = tid % TX;
  const int ty = tid / TX;
  const WT* wm = w + static_cast<int64_t>(mat) * w_matrix_stride;
  const float* b = bias != nullptr ? bias + static_cast<int64_t>(mat) * bias_stride : nullptr;

  // Row tiles blockIdx.y, + gridDim.y, ... (y is capped at kMaxGridY). The
  // bounds are the block's own: every thread takes the same iterations and
  // reaches the same barriers.
  for (int64_t tile_m0 = static_cast<int64_t>(blockIdx.y) * TM; tile_m0 < row_count;
       tile_m0 += static_cast<int64_t>(gridDim.y) * TM) {
    const int m0 = static_cast<int>(tile_m0);
    for (int i = tid; i < TM; i += kThreads) {
      LocateRow(rows_of, m0 + i, offsets, a_rows, slot_stride, lda, a_head_cols, &a_offset[i],
                &out_row[i]);
    }
    __syncthreads();

    float acc[RM][RN], chunk[RM][RN];
    SIMT_UNROLL
    for (int i = 0; i < RM; ++i) {
      SIMT_UNROLL
      for (int j = 0; j < RN; ++j) acc[i][j] = chunk[i][j] = 0.0f;
    }

    for (int k0 = 0; k0 < k_dim; k0 += kTileK) {
      const int depth = min(kTileK, k_dim - k0);
      for (int idx = tid; idx < kTileK * TM; idx += kThreads) {
        const int kk = idx % kTileK;
        const int i = idx / kTileK;
        const int64_t offset = a_offset[i];
        a_tile[kk * TM + i] = offset >= 0 && kk < depth ? a[offset + k0 + kk] : 0.0f;
      }
      for (int idx = tid; idx < kTileK * TN; idx += kThreads) {
        int kk, nn;
        if (kLayout == WeightLayout::kNK) {
          kk = idx % kTileK;
          nn = idx / kTileK;
        } else {
          nn = idx % TN;
          kk = idx / TN;
        }
        const int n = n0 + nn;
        float v = 0.0f;
        if (n < n_cols && kk < depth) {
          v = Widen(kLayout == WeightLayout::kNK ? wm[static_cast<int64_t>(n) * ldw + k0 + kk]
                                                 : wm[static_cast<int64_t>(k0 + kk) * ldw + n]);
        }
        w_tile[kk * TN + nn] = v;
      }
      __syncthreads();
      for (int kk = 0; kk < depth; ++kk) {
        float av[RM], wv[RN];
        SIMT_UNROLL
        for (int i = 0; i < RM; ++i) av[i] = a_tile[kk * TM + ty + i * TY];
        SIMT_UNROLL
        for (int j = 0; j < RN; ++j) wv[j] = w_tile[kk * TN + tx + j * TX];
        SIMT_UNROLL
        for (int i = 0; i < RM; ++i) {
          SIMT_UNROLL
          for (int j = 0; j < RN; ++j) chunk[i][j] = fmaf(av[i], wv[j], chunk[i][j]);
        }
      }
      if ((k0 + kTileK) % kChunk == 0 || k0 + kTileK >= k_dim) {
        SIMT_UNROLL
        for (int i = 0; i < RM; ++i) {
          SIMT_UNROLL
          for (int j = 0; j < RN; ++j) {
            acc[i][j] += chunk[i][j];
            chunk[i][j] = 0.0f;
          }
        }
      }
      __syncthreads();
    }

    SIMT_UNROLL
    for (int i = 0; i < RM; ++i) {
      const int64_t row = out_row[ty + i * TY];
      if (row < 0) continue;
      SIMT_UNROLL
      for (int j = 0; j < RN; ++j) {
        const int n = n0 + tx + j * TX;
        if (n < n_cols) Store(acc[i][j], alpha, b, act, accumulate, out + row * ldc + n, n);
      }
    }
    // The next tile rewrites out_row, read above.
    if (tile_m0 + static_cast<int64_t>(gridDim.y) * TM < row_count) __syncthreads();
  }
}

// Few rows: 16 warps, 32 columns (one per lane), up to 8 rows (warp r < 8
// owns row r's total). Each round, warp w sums chunk c0 + w for every row;
// then warp r adds the round's chunk sums of row r in chunk order.
constexpr int kFewWarps = 16;
constexpr int kFewRows = 8;
constexpr int kFewCols = 32;

template <typename WT, WeightLayout kLayout>
__global__ void __launch_bounds__(kFewWarps * 32)
    LinearFewRowsKernel(const float* a, int64_t lda, int dense_rows, const int32_t* offsets,
                        const int32_t* a_rows, int64_t slot_stride, int n_experts,
                        int shared_router, int64_t a_head_cols, int k_dim, const WT* w, int64_t ldw,
                        int64_t w_matrix_stride, int n_cols, float alpha, const float* bias,
                        int64_t bias_stride, Activation act, int accumulate, float* out,
                        int64_t ldc) {
  SIMT_GRID_WAIT();
  constexpr int kVector = 16 / sizeof(WT);                  // elements per 16-byte load
  SIMT_SHARED(float, part, kFewWarps* kFewRows* kFewCols);  // [warp][row][column]
  SIMT_SHARED(int64_t, a_offset, kFewRows);
  SIMT_SHARED(int64_t, out_row, kFewRows);

  const int mat = blockIdx.z;
  const MatrixRows rows_of = RowsOf(mat, dense_rows, offsets, n_experts, shared_router);
  const int row_count = rows_of.count;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int n = blockIdx.x * kFewCols + lane;
  const WT* wm = w + static_cast<int64_t>(mat) * w_matrix_stride;
  // 16-byte loads along k where every chunk of a stored row starts aligned.
  const bool vector_k = kLayout == WeightLayout::kNK && reinterpret_cast<uintptr_t>(wm) % 16 == 0 &&
                        (ldw * static_cast<int64_t>(sizeof(WT))) % 16 == 0;
  const int chunks = (k_dim + kChunk - 1) / kChunk;

  // Row groups blockIdx.y, + gridDim.y, ... (y is capped at kMaxGridY). The
  // bounds are the block's own: every thread takes the same iterations and
  // reaches the same barriers.
  for (int64_t group_m0 = static_cast<int64_t>(blockIdx.y) * kFewRows; group_m0 < row_count;
       group_m0 += static_cast<int64_t>(gridDim.y) * kFewRows) {
    const int m0 = static_cast<int>(group_m0);
    const int rows = min(kFewRows, row_count - m0);
    if (tid < kFewRows) {
      LocateRow(rows_of, m0 + tid, offsets, a_rows, slot_stride, lda, a_head_cols, &a_offset[tid],
                &out_row[tid]);
    }
    __syncthreads();

    float total = 0.0f;  // row `warp`, column n
    for (int c0 = 0; c0 < chunks; c0 += kFewWarps) {
      float sum[kFewRows];
      SIMT_UNROLL
      for (int r = 0; r < kFewRows; ++r) sum[r] = 0.0f;
      const int c = c0 + warp;
      if (c < chunks && n < n_cols) {
        const int kb = c * kChunk;
        const int ke = min(kb + kChunk, k_dim);
        if (ke - kb == kChunk) {  // a whole chunk: all its loads in flight at once
          float wv[kChunk];
          if (vector_k) {
            const WT* wp = wm + static_cast<int64_t>(n) * ldw + kb;
            SIMT_UNROLL
            for (int v = 0; v < kChunk; v += kVector) WidenVector(wp + v, wv + v);
          } else {
            SIMT_UNROLL
            for (int kk = 0; kk < kChunk; ++kk) {
              wv[kk] =
                  Widen(kLayout == WeightLayout::kNK ? wm[static_cast<int64_t>(n) * ldw + kb + kk]
                                                     : wm[static_cast<int64_t>(kb + kk) * ldw + n]);
            }
          }
          SIMT_UNROLL
          for (int r = 0; r < kFewRows; ++r) {
            if (r < rows) {
              const float* ar = a + a_offset[r] + kb;
              SIMT_UNROLL
              for (int kk = 0; kk < kChunk; ++kk) sum[r] = fmaf(ar[kk], wv[kk], sum[r]);
            }
          }
        } else {
          for (int k = kb; k < ke; ++k) {
            const float wk =
                Widen(kLayout == WeightLayout::kNK ? wm[static_cast<int64_t>(n) * ldw + k]
                                                   : wm[static_cast<int64_t>(k) * ldw + n]);
            SIMT_UNROLL
            for (int r = 0; r < kFewRows; ++r) {
              if (r < rows) sum[r] = fmaf(a[a_offset[r] + k], wk, sum[r]);
            }
          }
        }
      }
      SIMT_UNROLL
      for (int r = 0; r < kFewRows; ++r) part[(warp * kFewRows + r) * kFewCols + lane] = sum[r];
      __syncthreads();
      const int round = min(kFewWarps, chunks - c0);
      if (warp < kFewRows) {
        for (int j = 0; j < round; ++j) total += part[(j * kFewRows + warp) * kFewCols + lane];
      }
      __syncthreads();
    }

    if (warp < rows && n < n_cols) {
      const float* b = bias != nullptr ? bias + static_cast<int64_t>(mat) * bias_stride : nullptr;
      Store(total, alpha, b, act, accumulate, out + out_row[warp] * ldc + n, n);
    }
    // The next group rewrites out_row, read above.
    if (group_m0 + static_cast<int64_t>(gridDim.y) * kFewRows < row_count) __syncthreads();
  }
}

// Blocks along the grid's y (row blocks): at most kMaxGridY.
unsigned GridY(int rows, int rows_per_block) {
  const int64_t blocks = (static_cast<int64_t>(rows) + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned>(std::min<int64_t>(blocks, kMaxGridY));
}

struct Launch {
  const float* a;
  int64_t lda;
  int dense_rows;
  const GroupedRows* grouped;  // null: dense
  int k;
  const LinearWeights* w;
  int n_cols;
  const LinearEpilogue* epilogue;
  float* out;
  int64_t ldc;
  cudaStream_t stream;
  LinearKernelChoice kernel;
};

template <typename WT, WeightLayout kLayout, int TY, int TX, int RM, int RN>
cudaError_t LaunchTile(const Launch& l) {
  constexpr int TM = TY * RM, TN = TX * RN;
  const GroupedRows none;
  const GroupedRows& g = l.grouped != nullptr ? *l.grouped : none;
  const int rows = l.grouped != nullptr ? g.max_rows : l.dense_rows;
  const int matrices = l.grouped != nullptr ? g.heads * g.n_experts : 1;
  const dim3 grid((l.n_cols + TN - 1) / TN, GridY(rows, TM), matrices);
  return SIMT_LAUNCH_DEPENDENT(
      (LinearKernel<WT, kLayout, TY, TX, RM, RN>), grid, dim3(TY * TX), 0, l.stream, l.a, l.lda,
      l.dense_rows, g.offsets, g.a_rows, g.slot_stride, g.n_experts, g.shared_router ? 1 : 0,
      g.a_head_cols, l.k, static_cast<const WT*>(l.w->data), l.w->ld, l.w->matrix_stride, l.n_cols,
      l.epilogue->alpha, l.epilogue->bias, l.epilogue->bias_stride, l.epilogue->activation,
      l.epilogue->accumulate ? 1 : 0, l.out, l.ldc);
}

template <typename WT, WeightLayout kLayout>
cudaError_t LaunchFewRows(const Launch& l) {
  const GroupedRows none;
  const GroupedRows& g = l.grouped != nullptr ? *l.grouped : none;
  const int rows = l.grouped != nullptr ? g.max_rows : l.dense_rows;
  const int matrices = l.grouped != nullptr ? g.heads * g.n_experts : 1;
  const dim3 grid((l.n_cols + kFewCols - 1) / kFewCols, GridY(rows, kFewRows), matrices);
  return SIMT_LAUNCH_DEPENDENT(
      (LinearFewRowsKernel<WT, kLayout>), grid, dim3(kFewWarps * 32), 0, l.stream, l.a, l.lda,
      l.dense_rows, g.offsets, g.a_rows, g.slot_stride, g.n_experts, g.shared_router ? 1 : 0,
      g.a_head_cols, l.k, static_cast<const WT*>(l.w->data), l.w->ld, l.w->matrix_stride, l.n_cols,
      l.epilogue->alpha, l.epilogue->bias, l.epilogue->bias_stride, l.epilogue->activation,
      l.epilogue->accumulate ? 1 : 0, l.out, l.ldc);
}

// A 64 x 64 tile walks all of k in one block, so tiles pay only where there
// are many of them. Measured on an H200 (docs/performance.md) against 128
// and 4096: with 512, a 30 + 2 x 32-token step and batch-256 decode both run
// 2-3x faster than with tiles from 65 rows up, and a 2048-token prefill
// keeps its tiles and its time.
constexpr int kTileMinBlocks = 512;

// Up to 64 rows, under 64 columns (routers), or too few 64 x 64 tiles to
// fill the GPU (a continuous-batching step's prompts beside its decodes):
// the few-rows kernel, which spreads the weights over k too; otherwise
// 64 x 64 tiles. Both give the same bits (the order is the same).
template <typename WT, WeightLayout kLayout>
cudaError_t LaunchShape(const Launch& l, int rows) {
  bool few_rows = l.kernel == LinearKernelChoice::kFewRows;
  if (l.kernel == LinearKernelChoice::kAuto) {
    const int64_t matrices = l.grouped != nullptr ? l.grouped->heads * l.grouped->n_experts : 1;
    const int64_t tiles = int64_t{(rows + 63) / 64} * ((l.n_cols + 63) / 64) * matrices;
    few_rows = rows <= 64 || l.n_cols < 64 || tiles < kTileMinBlocks;
  }
  if (few_rows) return LaunchFewRows<WT, kLayout>(l);
  return LaunchTile<WT, kLayout, 16, 16, 4, 4>(l);
}

template <typename WT>
cudaError_t LaunchLayout(const Launch& l, int rows) {
  return l.w->layout == WeightLayout::kNK ? LaunchShape<WT, WeightLayout::kNK>(l, rows)
                                          : LaunchShape<WT, WeightLayout::kKN>(l, rows);
}

cudaError_t Dispatch(const Launch& l) {
  const int rows = l.grouped != nullptr ? l.grouped->max_rows : l.dense_rows;
  if (rows < 0 || l.k < 0 || l.n_cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || l.n_cols == 0) return cudaSuccess;
  switch (l.w->type) {
    case WeightType::kF32:
      return LaunchLayout<float>(l, rows);
    case WeightType::kBf16:
      return LaunchLayout<__nv_bfloat16>(l, rows);
    case WeightType::kF16:
      return LaunchLayout<__half>(l, rows);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchLinear(const float* a, int64_t lda, int rows, int k, const LinearWeights& w,
                         int n_cols, const LinearEpilogue& epilogue, float* out, int64_t ldc,
                         cudaStream_t stream, LinearKernelChoice kernel) {
  return Dispatch(
      Launch{a, lda, rows, nullptr, k, &w, n_cols, &epilogue, out, ldc, stream, kernel});
}

cudaError_t LaunchGroupedLinear(const float* a, int64_t lda, const GroupedRows& rows, int k,
                                const LinearWeights& w, int n_cols, const LinearEpilogue& epilogue,
                                float* out, int64_t ldc, cudaStream_t stream,
                                LinearKernelChoice kernel) {
  if (rows.offsets == nullptr || rows.n_experts < 1 || rows.heads < 1) {
    return cudaErrorInvalidValue;
  }
  return Dispatch(Launch{a, lda, 0, &rows, k, &w, n_cols, &epilogue, out, ldc, stream, kernel});
}

}  // namespace switchserve::cuda
