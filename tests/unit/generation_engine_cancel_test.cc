// The GenerationEngine ending requests early: cancelled by the client or for a
// passed deadline, their KV blocks freed and the tokens they held sent.
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/runtime/generation_engine.h"
#include "gtest/gtest.h"
#include "tests/util/generation_engine_fixture.h"

namespace switchserve {
namespace {

using testing::CollectingSink;

// Counts the engine's steps.
class StepCounter : public EngineObserver {
 public:
  void OnStep(const StepReport&) override { ++steps; }
  std::atomic<int64_t> steps{0};
};

class GenerationEngineTest : public testing::GenerationEngineFixture {
 protected:
  // A greedy request of `max_new_tokens` with a deadline `deadline_ms` from
  // now, on a started engine whose steps take `step_delay_ms`; its sink, ended.
  std::shared_ptr<CollectingSink> RunWithDeadline(int step_delay_ms, int max_new_tokens,
                                                  int deadline_ms) {
    Init(256, 256, 16);
    backend_->set_step_delay_ms(step_delay_ms);
    engine_->Start();
    auto sink = std::make_shared<CollectingSink>();
    GenerationRequest request;
    request.prompt = {1, 2, 3};
    request.sampling = Greedy(max_new_tokens);
    request.deadline = Clock::now() + std::chrono::milliseconds(deadline_ms);
    request.sink = sink;
    EXPECT_TRUE(engine_->Submit(std::move(request)).ok());
    sink->Wait();
    return sink;
  }
};

TEST_F(GenerationEngineTest, CancelFreesBlocks) {
  Init(256, 256, 16);
  backend_->set_step_delay_ms(2);
  engine_->Start();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  std::vector<RequestId> ids;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(Submit("cancel me " + std::to_string(i), Greedy(200)));
    ids.push_back(last_id_);
  }
  while (sinks[7]->updates() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(engine_->Snapshot().used_blocks, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 2 == 0) {
      engine_->Cancel(ids[i]);
    } else {
      engine_->Cancel(ids[i], CancelCause::kDeadline);  // as the server does for a passed deadline
    }
  }
  for (size_t i = 0; i < sinks.size(); ++i) {
    const GenerationUpdate& final = sinks[i]->Wait();
    EXPECT_EQ(final.finish_reason, FinishReason::kCancelled);
    EXPECT_EQ(final.cancel_cause, i % 2 == 0 ? CancelCause::kClient : CancelCause::kDeadline);
  }
  // The snapshot is published after the step that dropped them.
  for (int i = 0; i < 100 && engine_->Snapshot().used_blocks != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(engine_->Snapshot().used_blocks, 0);
}

TEST_F(GenerationEngineTest, DeadlineEndsRequest) {
  auto sink = RunWithDeadline(/*step_delay_ms=*/2, 250, /*deadline_ms=*/30);
  const GenerationUpdate& final = sink->Wait();
  EXPECT_EQ(final.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(final.cancel_cause, CancelCause::kDeadline);
  EXPECT_LT(final.completion_tokens, 250);
}

// A deadline that passes during a request's last step: the client has
// stopped waiting, so the request ends by its deadline with the token it got,
// not as finished by its length (the server counted and logged OK for a call
// whose client saw DEADLINE_EXCEEDED).
TEST_F(GenerationEngineTest, DeadlinePassingDuringTheLastStepEndsTheRequestByIt) {
  // One token: its first step is its last.
  auto sink = RunWithDeadline(/*step_delay_ms=*/60, 1, /*deadline_ms=*/15);
  const GenerationUpdate& final = sink->Wait();
  EXPECT_EQ(final.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(final.cancel_cause, CancelCause::kDeadline);
  EXPECT_EQ(final.completion_tokens, 1);  // sampled in the step, before the deadline was seen
  EXPECT_EQ(sink->ids_.size(), 1u);
}

TEST_F(GenerationEngineTest, HeldTokensReachTheSinkBeforeAnEarlyEnd) {
  // Cancelled (by the client, by the deadline) while holding tokens: they
  // come in an ordinary update, then the final one, as token by token.
  StepCounter steps;
  Init(256, 256, 16, 1000, std::nullopt, &steps);
  backend_->set_step_delay_ms(2);
  engine_->Start();
  auto cancelled = Submit("cancel me", Greedy(200), /*stream_interval=*/1000);
  const RequestId id = last_id_;
  auto sink = std::make_shared<CollectingSink>();
  GenerationRequest request;
  request.prompt = {1, 2, 3};
  request.sampling = Greedy(250);
  request.stream_interval = 1000;
  // 250 steps of >= 2 ms cannot end before it.
  request.deadline = Clock::now() + std::chrono::milliseconds(300);
  request.sink = sink;
  ASSERT_TRUE(engine_->Submit(std::move(request)).ok());
  // Every step samples a token of each.
  while (steps.steps < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine_->Cancel(id);
  for (const auto& s : {cancelled, sink}) {
    const GenerationUpdate& final = s->Wait();
    EXPECT_EQ(final.finish_reason, FinishReason::kCancelled);
    ASSERT_GT(final.completion_tokens, 1);
    EXPECT_EQ(static_cast<int>(s->ids_.size()), final.completion_tokens);
    EXPECT_EQ(s->sizes_, (std::vector<int>{1, final.completion_tokens - 1, 0}));
    EXPECT_EQ(s->text_.size(), s->ids_.size());  // printable ASCII from the fake backend
  }
  engine_->Stop();  // the engine reports to `steps` until it stops
}

TEST_F(GenerationEngineTest, AnEarlyEndReleasesNoTextHeldBack) {
  // Text that may begin a stop string is held back until that is decided; a
  // request that ends before (cancelled, the server's drain timeout) ends
  // with the text it had released, as token by token, not with the held
  // text, which the stop string may have been about to take out.
  Init(256, 256, 16);
  engine_->Start();
  auto reference = Submit("held back", Greedy(100));
  reference->Wait();
  ASSERT_EQ(reference->text_.size(), 100u);
  backend_->set_step_delay_ms(2);
  for (const int interval : {1, 1000}) {
    SamplingParams p = Greedy(200);
    p.stop = {reference->text_};  // completes at the 100th token, 200 ms away
    auto sink = Submit("held back", p, interval);
    const RequestId id = last_id_;
    while (sink->updates() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a few tokens more
    engine_->Cancel(id, CancelCause::kShutdown);
    const GenerationUpdate& final = sink->Wait();
    EXPECT_EQ(final.finish_reason, FinishReason::kCancelled);
    EXPECT_GT(final.completion_tokens, 0);
    EXPECT_LT(final.completion_tokens, 100);
    EXPECT_EQ(sink->text_, "") << "stream interval " << interval;
  }
  engine_->Stop();
}

}  // namespace
}  // namespace switchserve
