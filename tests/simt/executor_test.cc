// CUDA semantics the executor reproduces, checked against expectations
// written from the CUDA Programming Guide (and on a GPU, with nvcc, against
// the hardware): barriers, x-fastest lane numbering, the shuffles' width
// rules, votes on short last warps, shared memory per block, atomics.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "tests/simt/executor_kernels.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

int Threads(dim3 block) { return static_cast<int>(block.x * block.y * block.z); }

std::string Shape(dim3 b) {
  return std::to_string(b.x) + "x" + std::to_string(b.y) + "x" + std::to_string(b.z);
}

TEST(SimtBarrier, EveryThreadSeesEveryOtherThreadsWriteAfterSyncthreads) {
  SIMT_REQUIRE_DEVICE();
  const int kRounds = 3;
  for (const dim3 block : {dim3(1), dim3(33), dim3(1024), dim3(32, 32), dim3(8, 8, 16),
                           dim3(7, 5, 3), dim3(2, 3, 64)}) {
    const int n = Threads(block);
    std::vector<int> expected(n);
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < kRounds; ++r) expected[i] += ((7 * i + 13 * r + 1) % n) * 31 + r;
    }
    for (const bool dynamic : {false, true}) {
      SCOPED_TRACE(Shape(block) + (dynamic ? " dynamic" : " SIMT_SHARED"));
      const std::vector<int> out = InEveryOrder([&] {
        DeviceArray<int> d_out(n);
        EXPECT_EQ(LaunchBarrierRounds(block, kRounds, dynamic, d_out.get()), cudaSuccess);
        return d_out.Download();
      });
      EXPECT_EQ(out, expected);
    }
  }
}

TEST(SimtWarp, LanesAreNumberedXFastestOnMultiDimensionalBlocks) {
  SIMT_REQUIRE_DEVICE();
  for (const dim3 block :
       {dim3(64), dim3(16, 8), dim3(8, 4, 4), dim3(4, 2, 16), dim3(2, 16, 2), dim3(1, 1, 64)}) {
    SCOPED_TRACE(Shape(block));
    const int n = Threads(block);
    const auto [first, neighbour] = InEveryOrder([&] {
      DeviceArray<int> d_first(n), d_neighbour(n);
      EXPECT_EQ(LaunchLaneIds(block, d_first.get(), d_neighbour.get()), cudaSuccess);
      return std::make_tuple(d_first.Download(), d_neighbour.Download());
    });
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(first[i], i / 32 * 32) << "thread " << i;
      EXPECT_EQ(neighbour[i], i ^ 1) << "thread " << i;
    }
  }
}

// The source lane of each shuffle per the CUDA Programming Guide.
int ShflSource(int lane, int src, int width) { return lane / width * width + src % width; }
int ShflUpSource(int lane, int delta, int width) {
  return lane % width >= delta ? lane - delta : lane;
}
int ShflDownSource(int lane, int delta, int width) {
  return lane % width + delta < width ? lane + delta : lane;
}
int ShflXorSource(int lane, int mask, int width) {
  const int src = lane ^ mask;  // earlier groups are reachable, later ones are not
  return src / width > lane / width || src >= 32 ? lane : src;
}

TEST(SimtWarp, ShufflesFollowTheirWidthRules) {
  SIMT_REQUIRE_DEVICE();
  const int n = 64;
  for (const int width : {32, 16, 8, 2}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const std::vector<int> out = InEveryOrder([&] {
      DeviceArray<int> d_out(4 * n);
      EXPECT_EQ(LaunchShuffles(n, width, d_out.get()), cudaSuccess);
      return d_out.Download();
    });
    for (int i = 0; i < n; ++i) {
      const int lane = i % 32;
      const int warp_base = i - lane;
      const int delta = width > 2 ? 3 : 1;
      const int mask = lane % 3 == 0 ? width / 2 : width;
      auto value = [&](int src_lane) { return 10 * (warp_base + src_lane) + 3; };
      EXPECT_EQ(out[4 * i + 0], value(ShflSource(lane, (5 * lane + 3) % 40, width))) << i;
      EXPECT_EQ(out[4 * i + 1], value(ShflUpSource(lane, delta, width))) << i;
      EXPECT_EQ(out[4 * i + 2], value(ShflDownSource(lane, delta, width))) << i;
      EXPECT_EQ(out[4 * i + 3], value(ShflXorSource(lane, mask, width))) << i;
    }
  }
}

TEST(SimtWarp, VotesAndMatchCoverOnlyTheLanesOfAShortLastWarp) {
  SIMT_REQUIRE_DEVICE();
  for (const int n : {20, 33, 48, 70, 1024}) {
    SCOPED_TRACE("block of " + std::to_string(n));
    const auto [ballot, match_int, match_float, vote, block] = InEveryOrder([&] {
      DeviceArray<unsigned> d_ballot(n), d_match_int(n), d_match_float(n);
      DeviceArray<int> d_vote(2 * n), d_block(3 * n);
      EXPECT_EQ(LaunchVotes(n, d_ballot.get(), d_match_int.get(), d_match_float.get(), d_vote.get(),
                            d_block.get()),
                cudaSuccess);
      return std::make_tuple(d_ballot.Download(), d_match_int.Download(), d_match_float.Download(),
                             d_vote.Download(), d_block.Download());
    });
    int count = 0;
    for (int i = 0; i < n; ++i) count += i % 3 == 0 ? 1 : 0;
    for (int i = 0; i < n; ++i) {
      const int lane = i % 32;
      const int lanes = std::min(32, n - (i - lane));
      unsigned want_ballot = 0, want_int = 0, want_float = 0;
      for (int l = 0; l < lanes; ++l) {
        if (l % 3 == 0) want_ballot |= 1u << l;
        if (l % 5 == lane % 5) want_int |= 1u << l;
        if (l % 4 == lane % 4) want_float |= 1u << l;
      }
      EXPECT_EQ(ballot[i], want_ballot) << i;
      EXPECT_EQ(match_int[i], want_int) << i;
      EXPECT_EQ(match_float[i], want_float) << i;
      EXPECT_EQ(vote[2 * i], lanes <= 20 ? 1 : 0) << i;
      EXPECT_EQ(vote[2 * i + 1], lanes > 7 ? 1 : 0) << i;
      EXPECT_EQ(block[3 * i + 0], count) << i;
      EXPECT_NE(block[3 * i + 1], 0) << i;
      EXPECT_NE(block[3 * i + 2], 0) << i;
    }
  }
}

TEST(SimtWarp, ReductionByWarpZeroAfterABlockBarrier) {
  SIMT_REQUIRE_DEVICE();
  const int kBlocks = 3;
  for (const int threads : {32, 96, 256, 1024}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    std::vector<float> x = RandomFloats(kBlocks * threads, threads, -8.0f, 8.0f);
    for (float& v : x) v = static_cast<float>(static_cast<int>(v));  // sums stay exact
    const std::vector<float> sums = InEveryOrder([&] {
      DeviceArray<float> d_x(x), d_out(kBlocks);
      EXPECT_EQ(LaunchBlockSum(kBlocks, threads, d_x.get(), d_out.get()), cudaSuccess);
      return d_out.Download();
    });
    for (int b = 0; b < kBlocks; ++b) {
      float want = 0;
      for (int i = 0; i < threads; ++i) want += x[b * threads + i];
      EXPECT_EQ(sums[b], want) << "block " << b;
    }
  }
}

TEST(SimtSharedMemory, ConcurrentBlocksHaveTheirOwnSharedArrays) {
  SIMT_REQUIRE_DEVICE();
  const auto [met, wrong] = InEveryOrder([] {
    DeviceArray<int> counters(2), d_met(2), d_wrong(2);
    EXPECT_EQ(cudaMemset(counters.get(), 0, 2 * sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_wrong.get(), 0, 2 * sizeof(int)), cudaSuccess);
    EXPECT_EQ(LaunchSharedIsolation(counters.get(), d_met.get(), d_wrong.get()), cudaSuccess);
    return std::make_tuple(d_met.Download(), d_wrong.Download());
  });
  EXPECT_EQ(met, (std::vector<int>{1, 1})) << "the two blocks did not run at the same time";
  EXPECT_EQ(wrong, (std::vector<int>{0, 0}));
}

TEST(SimtAtomics, AtomicsAcrossBlocksAndInSharedMemoryLoseNoUpdate) {
  SIMT_REQUIRE_DEVICE();
  const int kBlocks = 256;
  const int n = kBlocks * 128;
  const auto [int_sum, float_sum, int_max, float_max, block_count] = InEveryOrder([&] {
    DeviceArray<int> d_int_sum(1), d_int_max(1), d_block_count(kBlocks);
    DeviceArray<float> d_float_sum(1), d_float_max(1);
    for (void* p : {static_cast<void*>(d_int_sum.get()), static_cast<void*>(d_int_max.get()),
                    static_cast<void*>(d_float_sum.get()), static_cast<void*>(d_float_max.get())}) {
      EXPECT_EQ(cudaMemset(p, 0, 4), cudaSuccess);
    }
    EXPECT_EQ(LaunchAtomics(kBlocks, d_int_sum.get(), d_float_sum.get(), d_int_max.get(),
                            d_float_max.get(), d_block_count.get()),
              cudaSuccess);
    return std::make_tuple(d_int_sum.Download(), d_float_sum.Download(), d_int_max.Download(),
                           d_float_max.Download(), d_block_count.Download());
  });
  EXPECT_EQ(int_sum[0], n);
  EXPECT_EQ(float_sum[0], static_cast<float>(n));
  EXPECT_EQ(int_max[0], n - 1);
  EXPECT_EQ(float_max[0], 0.5f * static_cast<float>(n - 1));
  EXPECT_EQ(block_count, std::vector<int>(kBlocks, 128));
}

TEST(SimtStack, ThreadsMayHoldAKernelsSixteenKibLocalArray) {
  SIMT_REQUIRE_DEVICE();
  DeviceArray<int> out(64);
  ASSERT_CUDA(LaunchLargeLocalArray(out.get()));
  const std::vector<int> sums = out.Download();
  for (int i = 0; i < 64; ++i) {
    // The reads visit every element once: sum of (j + i) over j < 4096.
    EXPECT_EQ(sums[i], 4096 * 4095 / 2 + 4096 * i) << i;
  }
}

}  // namespace
}  // namespace switchserve::simt_test
