// Part of matmul_x86_kernels.h: MatmulRowsOut itself: which tiles a product
// takes by its rows, and column blocks for many rows.
// Included by that file only, in its order (each part uses the ones
// before it); no include guard, internal linkage, as that file says.

namespace switchserve::cpu {
namespace {

// Whether one row's rows-out tiles prefetch the weights they read next (the
// next tile's rows, or further on in a tiled block). In the AVX2 build, f32
// weights stream faster without, from the hardware prefetcher alone:
// matmul_bench FromMemory on an AMD EPYC (Zen 3) VM, two threads, one row,
// medians of 8 repetitions interleaved in one process, 1.09-1.29x for q, the
// FFN's up and down projections (one and four experts) and the output head
// row-major; tiled, 0.76-0.86 of the read bandwidth with, 0.77-0.96 without
// against k = 1024, 0.75-0.81 with and 0.80-0.93 without against k = 128.
// bf16 weights stream faster with it (row-major: 0.66-0.84 of the read
// bandwidth against 0.50-0.63 without, in most runs). The AVX-512 build keeps
// it for both row-major (not measured there); its tiled tiles prefetch on
// Intel CPUs only (TiledAhead).
template <DType WT>
constexpr bool kOneRowPrefetch =
#ifdef SWITCHSERVE_MATMUL_ZMM
    true;
#else
    WT != DType::kF32;
#endif

template <DType WT>
void RowsOutOneRow(const MatmulArgs& g) {
  constexpr int kCols = Tiles::kOneRowOutCols;
  const float* a[1] = {RowOfA(g, 0)};
  for (int j0 = 0; j0 < g.n; j0 += kCols) {
    const int nr = g.n - j0 < kCols ? g.n - j0 : kCols;
    const WeightMatrix w = g.w.At(j0, 0);
    DotTiles<WT, 1, kCols, kOneRowPrefetch<WT>>::For(w, 1, nr)(a, w, g.k, g.c + j0, g.ldc, g.alpha,
                                                               g.accumulate);
  }
}

// Weight bytes of one column block of a rows-out product of many rows: most
// of the L2 cache, with room for the rows of `a` passing through.
constexpr int64_t kOutColumnBlockBytes = 192 << 10;

// MatmulRowsOut with the 8-lane tiles, `block_cols` (a multiple of NR) columns
// of weights at a time: each register tile of rows takes the block's columns
// in turn, the first row tile reading them from memory (prefetching the next
// tile's) and the others from the cache, half precision widened in registers.
// A few rows take one weight tile per block, so that it stays in the L1 cache
// for them. Many rows take a block of up to kOutColumnBlockBytes, which stays
// in the L2 cache while each row tile's inputs stay in L1: per multiply-add
// step a tile then reads its NR weight vectors from L2 and its MR input
// vectors from L1, rather than the other way round (the inputs, being more,
// are the stream the L2 cache could not feed).
template <DType WT>
void RowsOutColumnBlocks(const MatmulArgs& g, int block_cols) {
  constexpr int MR = Tiles::kOutRows, NR = Tiles::kOutCols;
  for (int j_block = 0; j_block < g.n; j_block += block_cols) {
    const int j_end = g.n < j_block + block_cols ? g.n : j_block + block_cols;
    for (int i0 = 0; i0 < g.m; i0 += MR) {
      const int mr = g.m - i0 < MR ? g.m - i0 : MR;
      const float* a[MR];
      for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
      for (int j0 = j_block; j0 < j_end; j0 += NR) {
        const int nr = j_end - j0 < NR ? j_end - j0 : NR;
        const WeightMatrix w = g.w.At(j0, 0);
        float* c = g.c + i0 * g.ldc + j0;
        if (i0 == 0) {
          DotTiles<WT, MR, NR, true>::For(w, mr, nr)(a, w, g.k, c, g.ldc, g.alpha, g.accumulate);
        } else {
          DotTiles<WT, MR, NR, false>::For(w, mr, nr)(a, w, g.k, c, g.ldc, g.alpha, g.accumulate);
        }
      }
    }
  }
}

#ifdef SWITCHSERVE_MATMUL_ZMM
// MatmulRowsOut for a few rows: one tile of 8 columns of weights at a time,
// which every row tile takes in turn, the first from memory (prefetching the
// next tile's rows) and the others from the L1 cache. Columns past the last
// whole tile take the 8-lane tiles (RowsOutColumnBlocks).
template <DType WT>
void RowsOutFewRows(const MatmulArgs& g) {
  constexpr int kCols = 2 * kPairCols;
  const int whole = g.n / kCols * kCols;
  for (int j0 = 0; j0 < whole; j0 += kCols) {
    const WeightMatrix w = g.w.At(j0, 0);
    for (int i0 = 0; i0 < g.m; i0 += kFewPairRows) {
      const int mr = g.m - i0 < kFewPairRows ? g.m - i0 : kFewPairRows;
      const float* a[kFewPairRows];
      for (int i = 0; i < mr; ++i) a[i] = RowOfA(g, i0 + i);
      const DotTileFn tile =
          i0 == 0 ? FewPairTiles<WT, true>::For(w, mr) : FewPairTiles<WT, false>::For(w, mr);
      tile(a, w, g.k, g.c + i0 * g.ldc + j0, g.ldc, g.alpha, g.accumulate);
    }
  }
  if (whole == g.n) return;
  MatmulArgs rest = g;
  rest.n = g.n - whole;
  rest.c = g.c + whole;
  rest.w = g.w.At(whole, 0);
  RowsOutColumnBlocks<WT>(rest, Tiles::kOutCols);
}
#endif

template <DType WT>
void RowsOut(const MatmulArgs& g) {
  if (g.c_scale != nullptr) return AddScaledProduct(g, RowsOut<WT>);
  if (g.m == 1) return RowsOutOneRow<WT>(g);
  constexpr int MR = Tiles::kOutRows, NR = Tiles::kOutCols;
#ifdef SWITCHSERVE_MATMUL_ZMM
  // From two full 16-lane row tiles on, weights packed into pairs. Fewer
  // rows (a decode step's projections and experts at small batches) read
  // them in place (packing a tile that few rows share cost more than it
  // saved: 1.4-1.5x as long for bf16 experts of 4 rows): in pairs where the
  // weight rows are short, whose products the multiply-adds bound (the FFN's
  // down projections, k 128), or where there is more than one tile of rows;
  // with the 8-lane tiles where one tile of rows takes long weight rows,
  // whose products stream (32 bf16 experts of 4 rows, matmul_bench FromMemory
  // on an AMD EPYC Zen 5 VM: k 128 1.25x faster in pairs, k 1024 1.15x
  // slower). With two or three tiles of rows the 8-lane tiles' multiply-adds
  // bound long rows too: on the Intel Xeon (Emerald Rapids) VM, 32 bf16
  // experts [128, 1024] of 8 rows from memory took 847 us with them, 663 in
  // pairs (matmul_bench FromMemory, medians of five alternated runs); in
  // engine_bench, batch 8, the q and k projections 0.92x as long and batch
  // 32's FFN 0.97x (each against the value experts' time in the same steps,
  // three alternated runs).
  if (g.m >= 2 * kPairRows) return RowsOutManyRows<WT>(g);
  if (static_cast<int64_t>(g.k) * ElementBytes<WT>() < kRowsInLongRowBytes || g.m > kFewPairRows) {
    return RowsOutFewRows<WT>(g);
  }
#endif
  // Tiled weights a block at a time, so that no register tile's rows lie in
  // two blocks.
  if (g.m <= kColumnBlockMinRowTiles * MR) {
    return RowsOutColumnBlocks<WT>(g, g.w.tiling == Tiling::kRowBlocks ? kTileRows : NR);
  }
  const int64_t row_bytes = static_cast<int64_t>(g.k) * ElementBytes<WT>();
  const int block_cols = static_cast<int>(kOutColumnBlockBytes / row_bytes) / NR * NR;
  RowsOutColumnBlocks<WT>(g, block_cols > NR ? block_cols : NR);
}

}  // namespace
}  // namespace switchserve::cpu
