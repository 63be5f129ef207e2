// --max-queue in the GenerationEngine: which submitted requests count as
// waiting (those the next step has no slot, KV blocks or token budget for, and
// those on their way from the engine's inbox to its scheduler), SubmitAll's
// all or none, and what Stop() does to the queue.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "engine/runtime/generation_engine.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/util/generation_engine_fixture.h"

namespace switchserve {
namespace {

using testing::CollectingSink;
using testing::FirstTokenRecorder;

// Holds the engine thread in the next step's report (OnStep) until Release():
// the engine's state stands still while a test submits against it. Records the
// most requests left waiting after a step.
class StepHold : public EngineObserver {
 public:
  void OnStep(const StepReport& report) override {
    std::unique_lock<std::mutex> lock(mu_);
    max_waiting_after_step = std::max(max_waiting_after_step, report.waiting);
    if (!hold_) return;
    held_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_; });
  }
  // Whether the engine reached the held step within 10 s.
  bool WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }
  int MaxWaitingAfterStep() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_waiting_after_step;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = true;
  bool held_ = false;
  int max_waiting_after_step = 0;
};

// Records the most requests the engine has reported waiting.
class WaitingHighWater : public EngineObserver {
 public:
  void OnStep(const StepReport&) override {}
  void OnStateChanged(const EngineSnapshot& snapshot) override {
    int seen = max_waiting.load();
    while (snapshot.waiting > seen && !max_waiting.compare_exchange_weak(seen, snapshot.waiting)) {
    }
  }
  std::atomic<int> max_waiting{0};
};

// The byte tokenizer, except that the engine thread, reading a prompt that
// starts with kGate (when it takes the request from its inbox and builds the
// request's state), stops there until Release(): a request is then in transit
// from the inbox to the scheduler for as long as a test needs.
class GatedTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kGate = 200;
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    return bytes_->Encode(text);
  }
  absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view text,
                                                   std::vector<size_t>* ends) const override {
    return bytes_->EncodeSpans(text, ends);
  }
  std::string Decode(absl::Span<const int32_t> ids) const override { return bytes_->Decode(ids); }
  std::string_view PieceBytes(int32_t id, bool first) const override {
    if (id == kGate && first) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!passed_) {
        held_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
        passed_ = true;
      }
    }
    return bytes_->PieceBytes(id, first);
  }
  std::string_view kind() const override { return bytes_->kind(); }
  int vocab_size() const override { return bytes_->vocab_size(); }

  // Whether the engine thread reached the gate within 10 s.
  bool WaitHeld() const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return held_; });
  }
  void Release() const {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<Tokenizer> bytes_ = CreateByteTokenizer();
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool held_ = false;
  mutable bool released_ = false;
  mutable bool passed_ = false;
};

class GenerationEngineTest : public testing::GenerationEngineFixture {
 protected:
  // Submits a one-token prompt without keeping its sink: the status only.
  absl::Status SubmitOneToken() {
    GenerationRequest request;
    request.prompt = {1};
    request.sink = std::make_shared<CollectingSink>();
    return engine_->Submit(std::move(request)).status();
  }
};

// --max-queue bounds the requests that must wait: those the running batch
// has room for (3 here) join it at the next step and are not counted.
TEST_F(GenerationEngineTest, QueueLimitCountsWhatTheBatchHasNoRoomForAndStop) {
  Init(256, 256, /*max_running=*/3, /*max_queue=*/2);
  // Not started: submissions stay queued.
  std::vector<std::shared_ptr<CollectingSink>> accepted;
  for (const char* prompt : {"a", "b", "c", "d", "e"})
    accepted.push_back(Submit(prompt, Greedy(5)));
  EXPECT_EQ(SubmitOneToken().code(), absl::StatusCode::kResourceExhausted);
  engine_->Stop();
  for (const auto& sink : accepted) {
    EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kCancelled);
    EXPECT_EQ(sink->Wait().cancel_cause, CancelCause::kShutdown);
  }
  GenerationRequest late;
  late.prompt = {1};
  late.sink = std::make_shared<CollectingSink>();
  EXPECT_EQ(engine_->Submit(std::move(late)).status().code(), absl::StatusCode::kUnavailable);
}

// SubmitAll (an HTTP request of several prompts) queues all its requests or
// none: one that does not fit leaves the others out too, so the refused
// request takes no room in the queue and no request of it reaches the
// observer (the metrics) as cancelled.
TEST_F(GenerationEngineTest, SubmitAllQueuesEveryRequestOrNone) {
  FirstTokenRecorder observer;
  Init(256, 256, /*max_running=*/1, /*max_queue=*/2, std::nullopt, &observer);
  // Not started: "a" joins the next step's batch, two more may wait.
  std::vector<std::shared_ptr<CollectingSink>> accepted = {Submit("a", Greedy(2))};
  std::vector<std::shared_ptr<CollectingSink>> refused_sinks;
  std::vector<GenerationRequest> three(3);
  for (GenerationRequest& request : three) {
    request.prompt = {1};
    request.sampling = Greedy(2);
    refused_sinks.push_back(std::make_shared<CollectingSink>());
    request.sink = refused_sinks.back();
  }
  EXPECT_EQ(engine_->SubmitAll(std::move(three)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The queue still has room for two.
  std::vector<GenerationRequest> two(2);
  std::vector<std::shared_ptr<CollectingSink>> two_sinks;
  for (GenerationRequest& request : two) {
    request.prompt = {1};
    request.sampling = Greedy(2);
    two_sinks.push_back(std::make_shared<CollectingSink>());
    request.sink = two_sinks.back();
  }
  auto ids = engine_->SubmitAll(std::move(two));
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (ids.ok()) {
    EXPECT_EQ(ids->size(), 2u);
    EXPECT_LT(ids->front(), ids->back());
    accepted.insert(accepted.end(), two_sinks.begin(), two_sinks.end());
  }
  EXPECT_EQ(SubmitOneToken().code(), absl::StatusCode::kResourceExhausted);
  engine_->Start();
  for (const auto& sink : accepted) EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kLength);
  engine_->Stop();  // before `observer` goes
  for (const auto& sink : refused_sinks) EXPECT_EQ(sink->updates(), 0);
  std::lock_guard<std::mutex> lock(observer.mu);
  EXPECT_EQ(std::count(observer.events.begin(), observer.events.end(), "finished"),
            static_cast<std::ptrdiff_t>(accepted.size()));
  EXPECT_EQ(accepted.size(), 3u);
}

// Room in the batch is a slot and KV blocks for a request's first chunk: a
// request the cache cannot take waits and counts against --max-queue
// (counting slots alone let a burst past the limit while the cache was full).
TEST_F(GenerationEngineTest, QueueLimitCountsRequestsTheCacheHasNoBlocksFor) {
  Init(/*blocks=*/4, 256, /*max_running=*/8, /*max_queue=*/1);
  // Not started: submissions stay queued. 12 tokens take 3 of the 4 blocks;
  // the next 8 need 2 more, so that one waits and fills the queue.
  std::vector<std::shared_ptr<CollectingSink>> accepted = {Submit("aaaaaaaaaaaa", Greedy(1)),
                                                           Submit("bbbbbbbb", Greedy(1))};
  EXPECT_EQ(SubmitOneToken().code(), absl::StatusCode::kResourceExhausted);
  engine_->Stop();
  for (const auto& sink : accepted) EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kCancelled);
}

// A step computes at most --max-batch-tokens tokens, so the requests that join
// the next step are also those its token budget has room for: with a budget
// of 4, one four-token prompt joins and the next waits (all 8 of 8 were
// accepted under --max-queue 1, 7 of them left waiting after the first step).
TEST_F(GenerationEngineTest, QueueLimitCountsRequestsTheStepsTokenBudgetHasNoRoomFor) {
  Init(/*blocks=*/256, /*max_tokens=*/4, /*max_running=*/8, /*max_queue=*/1);
  // Not started: submissions stay queued.
  std::vector<std::shared_ptr<CollectingSink>> accepted = {Submit("aaaa", Greedy(1)),
                                                           Submit("bbbb", Greedy(1))};
  EXPECT_EQ(SubmitOneToken().code(), absl::StatusCode::kResourceExhausted);
  engine_->Stop();
  for (const auto& sink : accepted) EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kCancelled);
}

// A prompt longer than the budget joins the next step with a first chunk of
// all of it, and the request behind it waits.
TEST_F(GenerationEngineTest, QueueLimitCountsALongPromptAsJoiningWithItsFirstChunk) {
  Init(/*blocks=*/256, /*max_tokens=*/4, /*max_running=*/8, /*max_queue=*/1);
  std::vector<std::shared_ptr<CollectingSink>> accepted = {Submit("aaaaaaaaaa", Greedy(1)),
                                                           Submit("b", Greedy(1))};
  EXPECT_EQ(SubmitOneToken().code(), absl::StatusCode::kResourceExhausted);
  engine_->Stop();
  for (const auto& sink : accepted) EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kCancelled);
}

// Each running request takes at least one token of the step's budget (its
// decode token) before any waiting one is admitted.
TEST_F(GenerationEngineTest, QueueLimitLeavesTheRunningRequestsTheirTokens) {
  StepHold hold;
  Init(/*blocks=*/256, /*max_tokens=*/4, /*max_running=*/8, /*max_queue=*/1, std::nullopt, &hold);
  engine_->Start();
  // Let the engine go and stop it before `hold` goes, also on a failed ASSERT.
  absl::Cleanup stop = [&] {
    hold.Release();
    engine_->Stop();
  };
  SamplingParams long_run = Greedy(200);
  long_run.ignore_eos = true;
  std::shared_ptr<CollectingSink> running = Submit("x", long_run);
  const RequestId running_id = last_id_;
  // The engine stands after the step that admitted it: one running, a budget
  // of 3 tokens left for the next step's admissions.
  ASSERT_TRUE(hold.WaitHeld());
  ASSERT_EQ(engine_->Snapshot().running, 1);
  std::vector<std::shared_ptr<CollectingSink>> accepted = {Submit("aaa", Greedy(1)),
                                                           Submit("bbb", Greedy(1))};
  const absl::Status third = SubmitOneToken();
  hold.Release();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  for (const auto& sink : accepted) EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kLength);
  engine_->Cancel(running_id);
  running->Wait();
  EXPECT_LE(hold.MaxWaitingAfterStep(), 1);
}

// Requests the engine has taken from its inbox but not yet handed to the
// scheduler still count: they were neither in the inbox nor in the published
// waiting count, so in that window a second queue's worth was accepted.
TEST_F(GenerationEngineTest, QueueLimitCountsRequestsOnTheirWayToTheScheduler) {
  auto gated = std::make_unique<GatedTokenizer>();
  const GatedTokenizer* gate = gated.get();
  tokenizer_ = std::move(gated);
  WaitingHighWater high_water;
  Init(/*blocks=*/256, 256, /*max_running=*/1, /*max_queue=*/1, std::nullopt, &high_water);
  engine_->Start();
  // Let the engine go and stop it before `high_water` goes, also on a failed
  // ASSERT.
  absl::Cleanup stop = [&] {
    gate->Release();
    engine_->Stop();
  };
  auto first = std::make_shared<CollectingSink>();
  GenerationRequest request;
  request.prompt = {GatedTokenizer::kGate, 'a'};
  request.sampling = Greedy(3);
  request.sink = first;
  ASSERT_TRUE(engine_->Submit(std::move(request)).ok());
  std::vector<std::shared_ptr<CollectingSink>> accepted = {first};
  // The engine thread holds the first request between its inbox and the
  // scheduler: it takes the only slot at the next step, so one more may wait.
  ASSERT_TRUE(gate->WaitHeld());
  accepted.push_back(Submit("b", Greedy(3)));
  const absl::Status third = SubmitOneToken();
  gate->Release();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  for (const auto& sink : accepted) EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kLength);
  EXPECT_LE(high_water.max_waiting.load(), 1);
}

// Sleeps in every step's report: the engine's state changes slowly enough
// for a test to submit against a queue it has published (snapshots are
// published between steps).
class SlowSteps : public EngineObserver {
 public:
  void OnStep(const StepReport&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
};

// A full queue takes a request of a better priority in place of the latest
// of its worst requests never admitted, which ends RESOURCE_EXHAUSTED
// ("displaced"); a request of the same priority as the worst is refused; a
// request that has begun (running) is never displaced.
TEST_F(GenerationEngineTest, AFullQueueGivesWayToABetterPriority) {
  SlowSteps slow;
  Init(/*blocks=*/256, 256, /*max_running=*/1, /*max_queue=*/2, std::nullopt, &slow);
  engine_->Start();
  absl::Cleanup stop = [&] { engine_->Stop(); };  // before `slow` goes
  auto submit = [&](int32_t priority,
                    int new_tokens) -> absl::StatusOr<std::shared_ptr<CollectingSink>> {
    GenerationRequest request;
    request.prompt = {'p', static_cast<int32_t>('0' + priority)};
    request.sampling = Greedy(new_tokens);
    request.priority = priority;
    auto sink = std::make_shared<CollectingSink>();
    request.sink = sink;
    absl::Status status = engine_->Submit(std::move(request)).status();
    if (!status.ok()) return status;
    return sink;
  };
  // The queue as published: `waiting` requests, the worst `count` of them
  // never admitted with `priority` (within 10 s).
  auto wait_for_queue = [&](int waiting, int32_t priority, int count) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      const EngineSnapshot snapshot = engine_->Snapshot();
      if (snapshot.waiting == waiting && snapshot.worst_fresh_priority == priority &&
          snapshot.worst_fresh_count == count) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  };
  // Priority 0 runs (nothing preempts it), 5 waits, 1 comes later.
  auto running = submit(0, 200);  // takes the only slot for 200 steps
  ASSERT_TRUE(running.ok());
  auto old_low = submit(5, 2);
  auto new_low = submit(5, 2);
  ASSERT_TRUE(old_low.ok() && new_low.ok());
  ASSERT_TRUE(wait_for_queue(2, 5, 2));
  EXPECT_EQ(submit(5, 2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(submit(6, 2).status().code(), absl::StatusCode::kResourceExhausted);

  auto high = submit(1, 2);
  ASSERT_TRUE(high.ok()) << high.status();
  const GenerationUpdate& displaced = (*new_low)->Wait();
  EXPECT_EQ(displaced.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(displaced.status.message().find("displaced"), std::string::npos) << displaced.status;
  EXPECT_EQ((*new_low)->updates(), 1);  // its final update only
  ASSERT_TRUE(wait_for_queue(2, 5, 1));

  auto second_high = submit(1, 2);
  ASSERT_TRUE(second_high.ok()) << second_high.status();
  EXPECT_EQ((*old_low)->Wait().status.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(wait_for_queue(2, 1, 2));
  // Only requests of the same priority wait now: none gives way to another.
  EXPECT_EQ(submit(1, 2).status().code(), absl::StatusCode::kResourceExhausted);
  for (const auto& sink : {*running, *high, *second_high}) {
    EXPECT_TRUE(sink->Wait().status.ok()) << sink->Wait().status;
    EXPECT_EQ(sink->Wait().finish_reason, FinishReason::kLength);
  }
}

}  // namespace
}  // namespace switchserve
