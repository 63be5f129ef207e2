// RunLoad's scheduling with transports that finish requests inside Start
// (as the in-process engine does when it refuses a request at once).
#include "bench/load/load_generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace switchserve::bench {
namespace {

// Refuses a request inside Start when `refuse(seed)`; completes every other
// one with two tokens on a thread of its own. Records how deeply Start calls
// nest on one thread and how many accepted requests are in flight at most.
class FakeTransport : public LoadTransport {
 public:
  explicit FakeTransport(bool (*refuse)(uint64_t)) : refuse_(refuse) {}
  ~FakeTransport() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void Start(uint64_t seed, RequestProgress* progress) override {
    thread_local int depth = 0;
    ++depth;
    {
      std::lock_guard<std::mutex> lock(mu_);
      max_depth_ = std::max(max_depth_, depth);
    }
    if (refuse_(seed)) {
      progress->OnDone(false, "refused");
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      accepted_.push_back(progress);
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
      cv_.notify_all();
    }
    --depth;
  }

  int max_depth() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_depth_;
  }
  int max_in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_;
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !accepted_.empty(); });
      if (accepted_.empty()) return;
      RequestProgress* progress = accepted_.front();
      accepted_.pop_front();
      --in_flight_;
      lock.unlock();
      progress->OnTokens(2);
      progress->OnDone(true, "");
      lock.lock();
    }
  }

  bool (*const refuse_)(uint64_t);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestProgress*> accepted_;
  int in_flight_ = 0;
  int max_in_flight_ = 0;
  int max_depth_ = 0;
  bool stopping_ = false;
  std::thread worker_{[this] { Work(); }};
};

// A closed loop whose every request is refused inside Start starts each
// successor after the refused Start has returned, never inside it: nested,
// a long enough run would overflow the stack.
TEST(RunLoad, RequestsRefusedInsideStartDoNotNest) {
  FakeTransport transport([](uint64_t) { return true; });
  LoadOptions options;
  options.concurrency = 8;
  options.requests = 2000;
  const LoadResult result = RunLoad(transport, options);
  EXPECT_EQ(transport.max_depth(), 1);
  EXPECT_NE(result.report.find("requests: 0 ok, 2000 failed"), std::string::npos) << result.report;
  EXPECT_NE(result.report.find("error refused: 2000"), std::string::npos) << result.report;
}

// Every other request refused inside Start (also on the thread that finishes
// the accepted ones): all are counted, each in its kind, and the loop keeps
// at most `concurrency` requests in flight.
TEST(RunLoad, KeepsItsConcurrencyWhenSomeRequestsAreRefusedAtOnce) {
  FakeTransport transport([](uint64_t seed) { return seed % 2 == 0; });
  LoadOptions options;
  options.concurrency = 4;
  options.requests = 400;
  options.seed = 0;
  const LoadResult result = RunLoad(transport, options);
  EXPECT_EQ(transport.max_depth(), 1);
  EXPECT_LE(transport.max_in_flight(), 4);
  EXPECT_NE(result.report.find("requests: 200 ok, 200 failed"), std::string::npos) << result.report;
  EXPECT_NE(result.report.find("error refused: 200"), std::string::npos) << result.report;
}

// A transport that only shows the prompt each seed's request would carry.
class PromptTransport : public LoadTransport {
 public:
  void Start(uint64_t, RequestProgress*) override {}
  std::vector<int32_t> PromptFor(uint64_t seed, std::vector<int32_t> ids) const {
    VaryTail(seed, ids);
    return ids;
  }
};

TEST(LoadTransport, DistinctTailsAreEachRequestsOwnAfterASharedPrefix) {
  const std::vector<int32_t> prompt = {40, 41, 42, 43, 44, 45, 46, 47, 48, 60};
  PromptTransport transport;
  EXPECT_EQ(transport.PromptFor(7, prompt), prompt);  // off by default
  transport.set_distinct_tail_tokens(4);
  std::set<std::vector<int32_t>> tails;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    const std::vector<int32_t> ids = transport.PromptFor(seed, prompt);
    ASSERT_EQ(ids.size(), prompt.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.begin() + 6, ids.begin())) << seed;
    for (size_t i = 6; i < ids.size(); ++i) {
      EXPECT_GE(ids[i], 40) << seed;  // the shared part's range
      EXPECT_LE(ids[i], 45) << seed;
    }
    EXPECT_EQ(transport.PromptFor(seed, prompt), ids);  // the seed decides
    tails.emplace(ids.begin() + 6, ids.end());
  }
  EXPECT_GE(tails.size(), 45u);  // 6^4 tails: a few repeats among 50 at most
}

}  // namespace
}  // namespace switchserve::bench
