// Tiled f32 matrix products with a batch-independent reduction order: a block
// computes a TM x TN tile of out, staging TK-deep slices of a and W in shared
// memory; each thread owns RM x RN outputs (rows ty + i * TY, columns
// tx + j * TX) and accumulates each with fmaf over k in increasing order. The
// tile shape changes which thread computes an output, never the order of its
// sum.
#include "kernels/cuda/linear.h"
#include "kernels/cuda/simt.h"

namespace switchserve::cuda {
namespace {

constexpr int kTileK = 16;

__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }

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

template <typename WT, WeightLayout kLayout, int TY, int TX, int RM, int RN>
__global__ void __launch_bounds__(TY* TX)
    LinearKernel(const float* a, int64_t lda, int dense_rows, const int32_t* offsets,
                 const int32_t* a_rows, int64_t slot_stride, int n_experts, int shared_router,
                 int64_t a_head_cols, int k_dim, const WT* w, int64_t ldw, int64_t w_matrix_stride,
                 int n_cols, float alpha, const float* bias, int64_t bias_stride, Activation act,
                 int accumulate, float* out, int64_t ldc) {
  constexpr int kThreads = TY * TX;
  constexpr int TM = TY * RM;
  constexpr int TN = TX * RN;
  SIMT_SHARED(float, a_tile, kTileK* TM);  // [kk][m]
  SIMT_SHARED(float, w_tile, kTileK* TN);  // [kk][n]
  SIMT_SHARED(int64_t, a_offset, TM);      // element offset of each tile row in a; -1: none
  SIMT_SHARED(int64_t, out_row, TM);

  const int mat = blockIdx.z;
  int head = 0, router = 0, row_begin = 0, row_count = dense_rows;
  if (offsets != nullptr) {
    head = mat / n_experts;
    router = shared_router != 0 ? 0 : head;
    const int32_t* o = offsets + static_cast<int64_t>(router) * (n_experts + 1);
    row_begin = o[mat % n_experts];
    row_count = o[mat % n_experts + 1] - row_begin;
  }
  const int m0 = blockIdx.y * TM;
  if (m0 >= row_count) return;  // the whole block, before any barrier
  const int n0 = blockIdx.x * TN;
  const int tid = threadIdx.x;
  const int tx = tid % TX;
  const int ty = tid / TX;
  const WT* wm = w + static_cast<int64_t>(mat) * w_matrix_stride;

  for (int i = tid; i < TM; i += kThreads) {
    const int local = m0 + i;
    int64_t offset = -1, row = -1;
    if (local < row_count) {
      if (offsets == nullptr) {
        offset = static_cast<int64_t>(local) * lda;
        row = local;
      } else {
        const int64_t slot = row_begin + local;
        const int64_t a_row =
            a_rows != nullptr ? a_rows[router * slot_stride + slot] : head * slot_stride + slot;
        offset = a_row * lda + head * a_head_cols;
        row = head * slot_stride + slot;
      }
    }
    a_offset[i] = offset;
    out_row[i] = row;
  }
  __syncthreads();

  float acc[RM][RN];
  SIMT_UNROLL
  for (int i = 0; i < RM; ++i) {
    SIMT_UNROLL
    for (int j = 0; j < RN; ++j) acc[i][j] = 0.0f;
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
        for (int j = 0; j < RN; ++j) acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }

  const float* b = bias != nullptr ? bias + static_cast<int64_t>(mat) * bias_stride : nullptr;
  SIMT_UNROLL
  for (int i = 0; i < RM; ++i) {
    const int m = ty + i * TY;
    const int64_t row = out_row[m];
    if (row < 0) continue;
    SIMT_UNROLL
    for (int j = 0; j < RN; ++j) {
      const int n = n0 + tx + j * TX;
      if (n >= n_cols) continue;
      float v = alpha * acc[i][j];
      if (b != nullptr) v += b[n];
      v = Activate(act, v);
      float* o = out + row * ldc + n;
      *o = accumulate != 0 ? *o + v : v;
    }
  }
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
};

template <typename WT, WeightLayout kLayout, int TY, int TX, int RM, int RN>
cudaError_t LaunchTile(const Launch& l) {
  constexpr int TM = TY * RM, TN = TX * RN;
  const GroupedRows none;
  const GroupedRows& g = l.grouped != nullptr ? *l.grouped : none;
  const int rows = l.grouped != nullptr ? g.max_rows : l.dense_rows;
  const int matrices = l.grouped != nullptr ? g.heads * g.n_experts : 1;
  const dim3 grid((l.n_cols + TN - 1) / TN, (rows + TM - 1) / TM, matrices);
  return SIMT_LAUNCH((LinearKernel<WT, kLayout, TY, TX, RM, RN>), grid, dim3(TY * TX), 0, l.stream,
                     l.a, l.lda, l.dense_rows, g.offsets, g.a_rows, g.slot_stride, g.n_experts,
                     g.shared_router ? 1 : 0, g.a_head_cols, l.k, static_cast<const WT*>(l.w->data),
                     l.w->ld, l.w->matrix_stride, l.n_cols, l.epilogue->alpha, l.epilogue->bias,
                     l.epilogue->bias_stride, l.epilogue->activation,
                     l.epilogue->accumulate ? 1 : 0, l.out, l.ldc);
}

// Few rows (decode): 8 x 128 tiles; otherwise 64 x 64.
template <typename WT, WeightLayout kLayout>
cudaError_t LaunchShape(const Launch& l, int rows) {
  if (rows <= 8) return LaunchTile<WT, kLayout, 2, 128, 4, 1>(l);
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
                         cudaStream_t stream) {
  return Dispatch(Launch{a, lda, rows, nullptr, k, &w, n_cols, &epilogue, out, ldc, stream});
}

cudaError_t LaunchGroupedLinear(const float* a, int64_t lda, const GroupedRows& rows, int k,
                                const LinearWeights& w, int n_cols, const LinearEpilogue& epilogue,
                                float* out, int64_t ldc, cudaStream_t stream) {
  if (rows.offsets == nullptr || rows.n_experts < 1 || rows.heads < 1) {
    return cudaErrorInvalidValue;
  }
  return Dispatch(Launch{a, lda, 0, &rows, k, &w, n_cols, &epilogue, out, ldc, stream});
}

}  // namespace switchserve::cuda
