// The thread-order knob (emulated build only): a kernel missing a barrier is
// caught in both directions, a correct kernel gives the same bits under every
// order, and the orders are what they claim (forward, reverse, a seeded
// permutation per barrier phase).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/simt.h"
#include "kernels/cuda/simt_control.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

constexpr int kThreads = 128;

// Each thread publishes its input and reads a neighbour's. With
// `barrier` = 0 the __syncthreads between the write and the read is missing.
__global__ void ReadHigherNeighbour(const int* in, int* out, int barrier) {
  SIMT_SHARED(int, values, kThreads);
  const int t = static_cast<int>(threadIdx.x);
  values[t] = in[t];
  if (barrier != 0) __syncthreads();
  out[t] = t + 1 < kThreads ? values[t + 1] : 0;
}

__global__ void ReadLowerNeighbour(const int* in, int* out, int barrier) {
  SIMT_SHARED(int, values, kThreads);
  const int t = static_cast<int>(threadIdx.x);
  values[t] = in[t];
  if (barrier != 0) __syncthreads();
  out[t] = t > 0 ? values[t - 1] : 0;
}

// Every thread reads a shared slot and does a warp shuffle; then `writer`
// reuses the slot. Without the barrier before the reuse, a warp that runs
// ahead overwrites the slot before slower warps have read it.
__global__ void ReuseSlotAfterShuffle(const int* in, int* out, int writer, int barrier) {
  SIMT_SHARED(int, slot, 1);
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) slot[0] = in[0];
  __syncthreads();
  const int v = slot[0] + __shfl_xor_sync(simt::kFullMask, 0, 1);
  if (barrier != 0) __syncthreads();
  if (t == writer) slot[0] = in[1];
  __syncthreads();
  out[t] = v;
}

// Records the order in which threads run: ticket = arrivals before it.
__global__ void Tickets(int* counter, int* ticket) {
  ticket[threadIdx.x] = atomicAdd(counter, 1);
  __syncthreads();
  ticket[blockDim.x + threadIdx.x] = atomicAdd(counter, 1);  // after the barrier: a new phase
}

using Kernel = void (*)(const int*, int*, int);

// The kernel's output under `order`.
std::vector<int> RunUnder(const std::string& order, Kernel kernel, bool barrier) {
  ScopedOrder scoped(order);
  std::vector<int> in(kThreads);
  for (int t = 0; t < kThreads; ++t) in[t] = 100 + t;
  DeviceArray<int> d_in(in), d_out(kThreads);
  EXPECT_EQ(SIMT_LAUNCH(kernel, dim3(1), dim3(kThreads), 0, nullptr, d_in.get(), d_out.get(),
                        barrier ? 1 : 0),
            cudaSuccess);
  return d_out.Download();
}

std::vector<int> Expected(int step) {
  std::vector<int> out(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    if (t + step >= 0 && t + step < kThreads) out[t] = 100 + t + step;
  }
  return out;
}

TEST(SimtOrder, ForwardOrderCatchesAThreadReadingAHigherThreadsValueTooEarly) {
  EXPECT_NE(RunUnder("forward", ReadHigherNeighbour, false), Expected(+1));
  EXPECT_EQ(RunUnder("reverse", ReadHigherNeighbour, false), Expected(+1))
      << "reverse order runs thread t+1 first, which hides this bug";
  EXPECT_NE(RunUnder("random:7", ReadHigherNeighbour, false), Expected(+1));
}

TEST(SimtOrder, ReverseOrderCatchesAThreadReadingALowerThreadsValueTooEarly) {
  EXPECT_EQ(RunUnder("forward", ReadLowerNeighbour, false), Expected(-1))
      << "forward order runs thread t-1 first, which hides this bug";
  // Shared memory is fresh in every block: the forward run's values are gone.
  EXPECT_NE(RunUnder("reverse", ReadLowerNeighbour, false), Expected(-1));
  EXPECT_NE(RunUnder("random:7", ReadLowerNeighbour, false), Expected(-1));
}

TEST(SimtOrder, TheEveryOrderHarnessFlagsBothMissingBarriers) {
  for (const Kernel kernel : {ReadHigherNeighbour, ReadLowerNeighbour}) {
    std::vector<std::vector<int>> results;
    for (const std::string& order : TestOrders()) results.push_back(RunUnder(order, kernel, false));
    bool differ = false;
    for (const auto& r : results) differ = differ || r != results[0];
    EXPECT_TRUE(differ) << "every order agreed on a kernel without its barrier";
  }
}

TEST(SimtOrder, WithTheBarrierEveryOrderGivesTheSameCorrectResult) {
  for (const std::string& order : TestOrders()) {
    EXPECT_EQ(RunUnder(order, ReadHigherNeighbour, true), Expected(+1)) << order;
    EXPECT_EQ(RunUnder(order, ReadLowerNeighbour, true), Expected(-1)) << order;
  }
}

std::vector<int> ReuseUnder(const std::string& order, int writer, bool barrier) {
  ScopedOrder scoped(order);
  DeviceArray<int> in(std::vector<int>{5, 6}), out(kThreads);
  EXPECT_EQ(SIMT_LAUNCH(ReuseSlotAfterShuffle, dim3(1), dim3(kThreads), 0, nullptr, in.get(),
                        out.get(), writer, barrier ? 1 : 0),
            cudaSuccess);
  return out.Download();
}

TEST(SimtOrder, AWarpRunningAheadExposesAValueOverwrittenBeforeOtherWarpsReadIt) {
  const std::vector<int> want(kThreads, 5);
  // The first warp overwrites: forward runs it ahead; reverse hides it.
  EXPECT_NE(ReuseUnder("forward", 0, false), want);
  EXPECT_EQ(ReuseUnder("reverse", 0, false), want);
  // The last warp overwrites: reverse runs it ahead.
  EXPECT_EQ(ReuseUnder("forward", kThreads - 1, false), want);
  EXPECT_NE(ReuseUnder("reverse", kThreads - 1, false), want);
  for (const std::string& order : TestOrders()) {
    EXPECT_EQ(ReuseUnder(order, 0, true), want) << order;
    EXPECT_EQ(ReuseUnder(order, kThreads - 1, true), want) << order;
  }
}

std::vector<int> TicketsUnder(const std::string& order, int threads) {
  ScopedOrder scoped(order);
  DeviceArray<int> counter(1), ticket(2 * threads);
  EXPECT_EQ(cudaMemset(counter.get(), 0, sizeof(int)), cudaSuccess);
  EXPECT_EQ(SIMT_LAUNCH(Tickets, dim3(1), dim3(threads), 0, nullptr, counter.get(), ticket.get()),
            cudaSuccess);
  return ticket.Download();
}

TEST(SimtOrder, OrdersRunThreadsAsNamedInEveryBarrierPhase) {
  const int n = 96;
  const std::vector<int> forward = TicketsUnder("forward", n);
  const std::vector<int> reverse = TicketsUnder("reverse", n);
  for (int t = 0; t < n; ++t) {
    EXPECT_EQ(forward[t], t);
    EXPECT_EQ(forward[n + t], n + t);
    EXPECT_EQ(reverse[t], n - 1 - t);
    EXPECT_EQ(reverse[n + t], 2 * n - 1 - t);
  }
  const std::vector<int> random = TicketsUnder("random:5", n);
  EXPECT_EQ(TicketsUnder("random:5", n), random) << "a seed gives one schedule";
  EXPECT_NE(TicketsUnder("random:6", n), random);
  EXPECT_NE(random, forward);
  EXPECT_NE(random, reverse);
  // Each phase is its own permutation.
  std::vector<int> first(random.begin(), random.begin() + n);
  std::vector<int> second(random.begin() + n, random.end());
  for (int& v : second) v -= n;
  EXPECT_NE(first, second);
}

TEST(SimtOrder, OrderNamesParse) {
  simt::ThreadOrder order;
  ASSERT_TRUE(simt::ParseThreadOrder("random:42", &order));
  EXPECT_EQ(order.order, simt::Order::kRandom);
  EXPECT_EQ(order.seed, 42u);
  EXPECT_EQ(simt::ToString(order), "random:42");
  ASSERT_TRUE(simt::ParseThreadOrder("reverse", &order));
  EXPECT_EQ(order.order, simt::Order::kReverse);
  for (const char* bad : {"", "random", "random:", "random:x1", "backward", "Forward"}) {
    EXPECT_FALSE(simt::ParseThreadOrder(bad, &order)) << bad;
  }
}

}  // namespace
}  // namespace switchserve::simt_test
