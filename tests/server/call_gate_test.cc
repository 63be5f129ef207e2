// CallGate: the drain state shared by the gRPC and HTTP front ends.
#include "server/call_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace switchserve {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(CallGate, IdleOnlyAfterEveryStartedCallIsDone) {
  CallGate gate;
  gate.CallStarted();
  gate.CallStarted();
  gate.CallDone();
  EXPECT_FALSE(gate.WaitUntilIdle(milliseconds(20)));
  EXPECT_EQ(gate.calls_in_flight(), 1);
  gate.CallDone();
  EXPECT_TRUE(gate.WaitUntilIdle(milliseconds(0)));
}

TEST(CallGate, DrainingRefusesFromThenOn) {
  CallGate gate;
  EXPECT_FALSE(gate.draining());
  gate.StartDraining();
  EXPECT_TRUE(gate.draining());
}

TEST(CallGate, QuietWaitsUntilNoCallHasStartedForThePeriod) {
  CallGate gate;
  gate.CallStarted();
  gate.CallDone();
  const auto start = Clock::now();
  EXPECT_TRUE(gate.WaitUntilQuiet(milliseconds(100), milliseconds(5000)));
  EXPECT_GE(Clock::now() - start, milliseconds(90));  // idle at once, quiet only later
}

// A gate idle long before the drain is not quiet at once: calls arriving
// just after it began are refused, not met by a closed listener.
TEST(CallGate, QuietCountsFromTheDrainsStart) {
  CallGate gate;
  gate.CallStarted();
  gate.CallDone();
  std::this_thread::sleep_for(milliseconds(150));
  gate.StartDraining();
  const auto start = Clock::now();
  EXPECT_TRUE(gate.WaitUntilQuiet(milliseconds(100), milliseconds(5000)));
  EXPECT_GE(Clock::now() - start, milliseconds(90));
}

TEST(CallGate, CallsThatKeepArrivingKeepItFromBeingQuietUntilTheTimeout) {
  CallGate gate;
  std::atomic<bool> stop{false};
  gate.CallStarted();
  gate.CallDone();
  std::thread arrivals([&] {
    while (!stop) {  // a refused call every 10 ms: never 300 ms without one
      std::this_thread::sleep_for(milliseconds(10));
      gate.CallStarted();
      gate.CallDone();
    }
  });
  const auto start = Clock::now();
  EXPECT_FALSE(gate.WaitUntilQuiet(milliseconds(300), milliseconds(600)));
  EXPECT_GE(Clock::now() - start, milliseconds(600));
  stop = true;
  arrivals.join();
  EXPECT_TRUE(gate.WaitUntilQuiet(milliseconds(100), milliseconds(5000)));
}

TEST(CallGate, ARunningCallKeepsItFromBeingQuiet) {
  CallGate gate;
  gate.CallStarted();
  EXPECT_FALSE(gate.WaitUntilQuiet(milliseconds(0), milliseconds(50)));
  gate.CallDone();
  EXPECT_TRUE(gate.WaitUntilQuiet(milliseconds(0), milliseconds(50)));
}

}  // namespace
}  // namespace switchserve
