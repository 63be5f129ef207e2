#include "server/byte_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace switchserve {
namespace {

TEST(ByteBudgetTest, ReservationsShareTheBudgetAndGiveItBack) {
  auto budget = std::make_shared<ByteBudget>(100);
  {
    ByteReservation a(budget);
    ByteReservation b(budget);
    EXPECT_TRUE(a.GrowTo(60));
    EXPECT_EQ(budget->used(), 60);
    EXPECT_FALSE(b.GrowTo(41));  // 60 + 41 > 100: nothing taken
    EXPECT_EQ(b.bytes(), 0);
    EXPECT_EQ(budget->used(), 60);
    EXPECT_TRUE(b.GrowTo(40));
    EXPECT_EQ(budget->used(), 100);
    EXPECT_TRUE(a.GrowTo(10));  // GrowTo never shrinks
    EXPECT_EQ(a.bytes(), 60);
    EXPECT_FALSE(a.GrowTo(61));
    EXPECT_EQ(a.bytes(), 60);
    // Moved, the reservation is held once and given back once.
    ByteReservation c(std::move(a));
    EXPECT_EQ(c.bytes(), 60);
    EXPECT_EQ(budget->used(), 100);
    b = std::move(c);
    EXPECT_EQ(budget->used(), 60);  // b's 40 given back, c's 60 now b's
  }
  EXPECT_EQ(budget->used(), 0);
  ByteReservation none;  // without a budget: anything fits, nothing is held
  EXPECT_TRUE(none.GrowTo(int64_t{1} << 40));
  none.ShrinkTo(0);
  EXPECT_EQ(none.bytes(), 0);
}

TEST(ByteBudgetTest, ShrinkingGivesBackTheDifferenceForOthersToTake) {
  auto budget = std::make_shared<ByteBudget>(100);
  ByteReservation a(budget);
  ByteReservation b(budget);
  EXPECT_TRUE(a.GrowTo(80));
  EXPECT_FALSE(b.GrowTo(30));
  a.ShrinkTo(50);
  EXPECT_EQ(a.bytes(), 50);
  EXPECT_EQ(budget->used(), 50);
  EXPECT_TRUE(b.GrowTo(30));
  a.ShrinkTo(70);  // ShrinkTo never grows
  EXPECT_EQ(a.bytes(), 50);
  EXPECT_EQ(budget->used(), 80);
  a.ShrinkTo(0);
  b.ShrinkTo(0);
  EXPECT_EQ(budget->used(), 0);
}

TEST(ByteBudgetTest, ThreadsTakingAtOnceNeverTakeMoreThanTheLimit) {
  ByteBudget budget(1000);
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) taken += budget.TryTake(1) ? 1 : 0;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(taken.load(), 1000);
  EXPECT_EQ(budget.used(), 1000);
  for (int i = 0; i < 1000; ++i) budget.Give(1);
  EXPECT_EQ(budget.used(), 0);
}

}  // namespace
}  // namespace switchserve
