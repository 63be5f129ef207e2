// The GenerationEngine's output: what a request gets (length, sampling, stop
// strings and ids, EOS, the repetition penalty), alone and in a crowded batch,
// streamed token by token or in groups, and when its first token is reported.
// Cancellation and deadlines: generation_engine_cancel_test.cc; --max-queue:
// generation_engine_queue_test.cc.
#include "engine/runtime/generation_engine.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/generation_engine_fixture.h"

namespace switchserve {
namespace {

using testing::CollectingSink;
using testing::FirstTokenRecorder;
using GenerationEngineTest = testing::GenerationEngineFixture;

// Two requests gave the same tokens and text.
void ExpectSameOutput(const CollectingSink& a, const CollectingSink& b) {
  EXPECT_EQ(a.ids_, b.ids_);
  EXPECT_EQ(a.text_, b.text_);
}

// Counts the preemptions the engine reports, step by step.
class PreemptionCounter : public EngineObserver {
 public:
  void OnStep(const StepReport& report) override { preempted += report.preempted; }
  std::atomic<int64_t> preempted{0};
};

TEST_F(GenerationEngineTest, GeneratesUntilLength) {
  Init(64, 64, 8);
  engine_->Start();
  auto sink = Submit("hello", Greedy(12));
  const GenerationUpdate& final = sink->Wait();
  EXPECT_TRUE(final.status.ok());
  EXPECT_EQ(final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(final.prompt_tokens, 5);
  EXPECT_EQ(final.completion_tokens, 12);
  EXPECT_EQ(sink->ids_.size(), 12u);
  EXPECT_EQ(sink->text_.size(), 12u);  // printable ASCII from the fake backend
  EXPECT_GE(final.total_ms, final.time_to_first_token_ms);
  EXPECT_EQ(engine_->Snapshot().used_blocks, 0);
}

TEST_F(GenerationEngineTest, GreedyOutputSameAloneAndInCrowdedBatchWithPreemption) {
  // Alone, with plenty of cache.
  Init(256, 1024, 64);
  engine_->Start();
  std::vector<std::string> prompts;
  for (int i = 0; i < 32; ++i) prompts.push_back("prompt number " + std::to_string(i * 7919));
  std::vector<std::string> alone;
  for (const auto& p : prompts) {
    auto sink = Submit(p, Greedy(40));
    sink->Wait();
    alone.push_back(sink->text_);
  }
  engine_->Stop();

  // Together, a small token budget (chunked prefill) and a cache far too small
  // for all of them (preemption by recompute).
  PreemptionCounter preemptions;
  Init(48, 24, 32, 1000, std::nullopt, &preemptions);
  engine_->Start();
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (const auto& p : prompts) sinks.push_back(Submit(p, Greedy(40)));
  for (size_t i = 0; i < sinks.size(); ++i) {
    const GenerationUpdate& final = sinks[i]->Wait();
    EXPECT_TRUE(final.status.ok());
    EXPECT_EQ(sinks[i]->text_, alone[i]) << "request " << i;
  }
  EXPECT_GT(backend_->max_sequences_per_step(), 1);
  EXPECT_LE(backend_->max_tokens_per_step(), 24);
  EXPECT_EQ(engine_->Snapshot().used_blocks, 0);
  engine_->Stop();  // no step runs after this; the observer's count is final
  EXPECT_GT(preemptions.preempted.load(), 0) << "the crowded run never preempted";
}

TEST_F(GenerationEngineTest, SeededSamplingIsReproducible) {
  Init(256, 256, 16);
  engine_->Start();
  SamplingParams p;
  p.temperature = 1.5f;
  p.max_new_tokens = 30;
  p.seed = 1234;
  auto a = Submit("seeded", p);
  auto noise = Submit("other traffic", p);
  auto b = Submit("seeded", p);
  a->Wait();
  b->Wait();
  noise->Wait();
  EXPECT_EQ(a->ids_, b->ids_);
  p.seed = 99;
  auto c = Submit("seeded", p);
  c->Wait();
  EXPECT_NE(a->ids_, c->ids_);
}

TEST_F(GenerationEngineTest, StopTokenAndStopString) {
  Init(256, 256, 16);
  engine_->Start();
  auto reference = Submit("abc", Greedy(20));
  reference->Wait();
  const std::string text = reference->text_;
  ASSERT_EQ(text.size(), 20u);

  SamplingParams p = Greedy(20);
  p.stop = {text.substr(5, 2)};
  auto stopped = Submit("abc", p);
  EXPECT_EQ(stopped->Wait().finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped->text_, text.substr(0, text.find(p.stop[0])));

  p = Greedy(20);
  p.stop_token_ids = {static_cast<unsigned char>(text[3])};
  auto by_id = Submit("abc", p);
  EXPECT_EQ(by_id->Wait().finish_reason, FinishReason::kStop);
  EXPECT_EQ(by_id->ids_.size(), text.find(text[3]) + 1);

  // ignore_eos ignores the model's EOS only: stop ids still end it.
  p.ignore_eos = true;
  auto ignoring_eos = Submit("abc", p);
  EXPECT_EQ(ignoring_eos->Wait().finish_reason, FinishReason::kStop);
  EXPECT_EQ(ignoring_eos->ids_, by_id->ids_);
}

// The repetition penalty counts the prompt's tokens as seen, not only the
// generated ones: with penalty 100 the fake model's first greedy token is
// never one of the prompt's (penalised logits are at most 4 / 100, every
// other at least 0.1), though unpenalised it is.
TEST_F(GenerationEngineTest, RepetitionPenaltyCountsThePromptsTokens) {
  Init(256, 256, 16);
  engine_->Start();
  std::string prompt;
  int32_t first = -1;
  for (int i = 0; i < 200 && prompt.empty(); ++i) {
    std::string candidate;
    for (int j = 0; j < 24; ++j) candidate += static_cast<char>(33 + (i * 7 + j * 13) % 90);
    auto sink = Submit(candidate, Greedy(1));
    sink->Wait();
    ASSERT_EQ(sink->ids_.size(), 1u);
    if (candidate.find(static_cast<char>(sink->ids_[0])) != std::string::npos) {
      prompt = candidate;
      first = sink->ids_[0];
    }
  }
  ASSERT_FALSE(prompt.empty()) << "no prompt whose first greedy token it holds";
  SamplingParams p = Greedy(1);
  p.repetition_penalty = 100.0f;
  auto penalised = Submit(prompt, p);
  penalised->Wait();
  ASSERT_EQ(penalised->ids_.size(), 1u);
  EXPECT_NE(penalised->ids_[0], first);
  EXPECT_EQ(prompt.find(static_cast<char>(penalised->ids_[0])), std::string::npos) << prompt;
}

TEST_F(GenerationEngineTest, EosEndsRequestUnlessIgnored) {
  // The greedy continuation without an EOS token; then the same with one of
  // its tokens declared the EOS id.
  Init(256, 256, 16);
  engine_->Start();
  auto reference = Submit("abc", Greedy(20));
  reference->Wait();
  const std::vector<int32_t> ids = reference->ids_;
  ASSERT_EQ(ids.size(), 20u);
  engine_->Stop();

  const int32_t eos = ids[6];
  const size_t first_eos = std::find(ids.begin(), ids.end(), eos) - ids.begin();
  Init(256, 256, 16, 1000, eos);
  engine_->Start();
  auto ended = Submit("abc", Greedy(20));
  const GenerationUpdate& final = ended->Wait();
  EXPECT_TRUE(final.status.ok());
  EXPECT_EQ(final.finish_reason, FinishReason::kEos);
  // The EOS token is the last one sent; its text is not.
  const std::vector<int32_t> expected(ids.begin(), ids.begin() + first_eos + 1);
  EXPECT_EQ(ended->ids_, expected);
  EXPECT_EQ(final.completion_tokens, static_cast<int>(first_eos) + 1);
  EXPECT_EQ(ended->text_, reference->text_.substr(0, first_eos));

  SamplingParams p = Greedy(20);
  p.ignore_eos = true;
  auto ignoring = Submit("abc", p);
  EXPECT_EQ(ignoring->Wait().finish_reason, FinishReason::kLength);
  EXPECT_EQ(ignoring->ids_, ids);
}

// min_tokens: the first tokens are neither the EOS nor a stop id (the
// sampler holds them back), and a stop string counts only when it ends in
// the text of a later token; without it the same request ends at once.
TEST_F(GenerationEngineTest, MinTokensKeepsTheFirstTokensFromEndingIt) {
  Init(256, 256, 16);
  engine_->Start();
  auto reference = Submit("abc", Greedy(20));
  reference->Wait();
  const std::vector<int32_t> ids = reference->ids_;
  const std::string text = reference->text_;
  ASSERT_EQ(text.size(), 20u);  // one byte a token

  // The stop string's first occurrence ends with the third token.
  SamplingParams p = Greedy(20);
  p.stop = {text.substr(1, 2)};
  auto early = Submit("abc", p);
  EXPECT_EQ(early->Wait().finish_reason, FinishReason::kStop);
  EXPECT_EQ(early->text_, text.substr(0, 1));
  p.min_tokens = 3;
  auto late = Submit("abc", p);
  const size_t next = text.find(p.stop[0], 2);
  EXPECT_EQ(late->Wait().finish_reason,
            next == std::string::npos ? FinishReason::kLength : FinishReason::kStop);
  EXPECT_EQ(late->ids_, ids);  // nothing held back: the same tokens
  EXPECT_EQ(late->text_, text.substr(0, next));
  engine_->Stop();

  const int32_t eos = ids[1];
  Init(256, 256, 16, 1000, eos);
  engine_->Start();
  p = Greedy(20);
  p.stop_token_ids = {ids[0]};
  auto at_once = Submit("abc", p);
  EXPECT_EQ(at_once->Wait().finish_reason, FinishReason::kStop);
  EXPECT_EQ(at_once->ids_, std::vector<int32_t>{ids[0]});
  p.min_tokens = 5;
  auto held = Submit("abc", p);
  const GenerationUpdate& final = held->Wait();
  EXPECT_TRUE(final.status.ok());
  ASSERT_GT(held->ids_.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NE(held->ids_[i], eos) << i;
    EXPECT_NE(held->ids_[i], ids[0]) << i;
  }
  // Later, either ends it, as the last token.
  const int32_t last = held->ids_.back();
  EXPECT_EQ(final.finish_reason, last == eos      ? FinishReason::kEos
                                 : last == ids[0] ? FinishReason::kStop
                                                  : FinishReason::kLength);
  // With ignore_eos the EOS is an id like another: not held back.
  p.ignore_eos = true;
  p.stop_token_ids = {};
  auto ignoring = Submit("abc", p);
  EXPECT_EQ(ignoring->Wait().finish_reason, FinishReason::kLength);
  EXPECT_EQ(ignoring->ids_, ids);
}

// include_stop_str_in_output: the text ends after the stop string, and the
// text of a stop id or the EOS that ends it is in it; the tokens are the
// same either way.
TEST_F(GenerationEngineTest, IncludedStopsEndTheTextAfterThem) {
  Init(256, 256, 16);
  engine_->Start();
  auto reference = Submit("abc", Greedy(20));
  reference->Wait();
  const std::string text = reference->text_;
  const std::vector<int32_t> ids = reference->ids_;
  SamplingParams p = Greedy(20);
  p.stop = {text.substr(5, 2)};
  p.include_stop_str_in_output = true;
  auto with_string = Submit("abc", p);
  EXPECT_EQ(with_string->Wait().finish_reason, FinishReason::kStop);
  EXPECT_EQ(with_string->text_, text.substr(0, text.find(p.stop[0]) + 2));

  p = Greedy(20);
  p.stop_token_ids = {ids[3]};
  p.include_stop_str_in_output = true;
  auto with_id = Submit("abc", p);
  EXPECT_EQ(with_id->Wait().finish_reason, FinishReason::kStop);
  const size_t last = std::find(ids.begin(), ids.end(), ids[3]) - ids.begin();
  EXPECT_EQ(with_id->ids_, std::vector<int32_t>(ids.begin(), ids.begin() + last + 1));
  EXPECT_EQ(with_id->text_, text.substr(0, last + 1));  // one byte a token
  engine_->Stop();

  Init(256, 256, 16, 1000, /*eos=*/ids[6]);
  engine_->Start();
  p = Greedy(20);
  p.include_stop_str_in_output = true;
  auto with_eos = Submit("abc", p);
  EXPECT_EQ(with_eos->Wait().finish_reason, FinishReason::kEos);
  const size_t eos_at = std::find(ids.begin(), ids.end(), ids[6]) - ids.begin();
  EXPECT_EQ(with_eos->text_, text.substr(0, eos_at + 1));
}

TEST_F(GenerationEngineTest, StreamIntervalSendsTheFirstTokenAloneThenGroups) {
  Init(256, 256, 16);
  engine_->Start();
  auto each = Submit("interval", Greedy(10));
  each->Wait();
  EXPECT_EQ(each->sizes_, std::vector<int>(10, 1));

  auto grouped = Submit("interval", Greedy(10), /*stream_interval=*/4);
  const GenerationUpdate& final = grouped->Wait();
  EXPECT_EQ(final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(final.completion_tokens, 10);
  // The first token at once, then 4 at a time, the rest with the end.
  EXPECT_EQ(grouped->sizes_, (std::vector<int>{1, 4, 4, 1}));
  ExpectSameOutput(*grouped, *each);

  // A stop string inside a group: the text ends where it did token by token.
  SamplingParams p = Greedy(10);
  p.stop = {each->text_.substr(6, 2)};
  auto stopped_each = Submit("interval", p);
  stopped_each->Wait();
  auto stopped_grouped = Submit("interval", p, 4);
  EXPECT_EQ(stopped_grouped->Wait().finish_reason, FinishReason::kStop);
  ExpectSameOutput(*stopped_grouped, *stopped_each);
}

TEST_F(GenerationEngineTest, StreamIntervalZeroSendsOnlyTheFinalUpdate) {
  Init(256, 256, 16);
  engine_->Start();
  auto each = Submit("at the end", Greedy(10));
  each->Wait();
  auto at_end = Submit("at the end", Greedy(10), /*stream_interval=*/0);
  const GenerationUpdate& final = at_end->Wait();
  EXPECT_EQ(final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(at_end->sizes_, std::vector<int>{10});
  ExpectSameOutput(*at_end, *each);
}

// The first token is reported in the step that sampled it, before the
// request ends (TTFT reached the metrics only at the end of a generation).
TEST_F(GenerationEngineTest, FirstTokenIsReportedAsItComes) {
  FirstTokenRecorder recorder;
  Init(256, 256, 16, 1000, std::nullopt, &recorder);
  backend_->set_step_delay_ms(20);
  engine_->Start();
  const GenerationUpdate final = Submit("hello", Greedy(6))->Wait();
  EXPECT_EQ(final.completion_tokens, 6);
  engine_->Stop();
  std::lock_guard<std::mutex> lock(recorder.mu);
  EXPECT_EQ(recorder.events, (std::vector<std::string>{"first token", "finished"}));
  EXPECT_GE(recorder.first_token, recorder.queue);
  // Five more 20 ms steps came after the first token.
  EXPECT_GE(recorder.total - recorder.first_token, 0.09);
}

}  // namespace
}  // namespace switchserve
