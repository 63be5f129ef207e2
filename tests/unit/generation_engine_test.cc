#include "engine/runtime/generation_engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/util/fake_backend.h"

namespace switchserve {
namespace {

// Collects a request's updates; Wait() blocks until the final one.
class CollectingSink : public GenerationSink {
 public:
  void OnUpdate(GenerationUpdate update) override {
    std::lock_guard<std::mutex> lock(mu_);
    text_ += update.text;
    for (const auto& t : update.tokens) ids_.push_back(t.token_id);
    sizes_.push_back(static_cast<int>(update.tokens.size()));
    ++updates_;
    if (update.finished) {
      final_ = std::move(update);
      done_ = true;
      cv_.notify_all();
    }
  }
  const GenerationUpdate& Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return final_;
  }
  int updates() {
    std::lock_guard<std::mutex> lock(mu_);
    return updates_;
  }
  std::string text_;
  std::vector<int32_t> ids_;
  std::vector<int> sizes_;  // tokens in each update, in order

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int updates_ = 0;
  GenerationUpdate final_;
};

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

// Counts the engine's steps.
class StepCounter : public EngineObserver {
 public:
  void OnStep(const StepReport&) override { ++steps; }
  std::atomic<int64_t> steps{0};
};

// Records when each request's first token and its end were reported.
class FirstTokenRecorder : public EngineObserver {
 public:
  void OnStep(const StepReport&) override {}
  void OnFirstToken(const GenerationRequest&, double queue_seconds,
                    double first_token_seconds) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("first token");
    queue = queue_seconds;
    first_token = first_token_seconds;
  }
  void OnRequestFinished(const GenerationRequest&, const GenerationUpdate& update) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("finished");
    total = update.total_ms / 1e3;
  }
  std::mutex mu;
  std::vector<std::string> events;
  double queue = -1, first_token = -1, total = -1;
};

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

class GenerationEngineTest : public ::testing::Test {
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

  void Init(int64_t blocks, int64_t max_tokens, int max_running, int max_queue = 1000,
            std::optional<int32_t> eos_token_id = std::nullopt,
            EngineObserver* observer = nullptr) {
    backend_ = std::make_unique<testing::FakeBackend>(256, 256);
    KvCacheOptions cache;
    cache.block_size = 4;
    cache.max_tokens = blocks * 4;
    auto kv_cache = KvCache::Create(backend_.get(), cache);
    ASSERT_TRUE(kv_cache.ok()) << kv_cache.status();
    kv_cache_ = *std::move(kv_cache);
    ASSERT_EQ(kv_cache_->num_blocks(), blocks);
    EngineOptions options;
    options.scheduler = {max_tokens, max_running};
    options.max_queue = max_queue;
    options.context_length = 256;
    options.eos_token_id = eos_token_id;
    engine_ = std::make_unique<GenerationEngine>(options, backend_.get(), kv_cache_.get(),
                                                 tokenizer_.get(), observer);
  }
  std::shared_ptr<CollectingSink> Submit(const std::string& prompt, SamplingParams params,
                                         int stream_interval = 1) {
    auto sink = std::make_shared<CollectingSink>();
    GenerationRequest request;
    request.prompt.assign(prompt.begin(), prompt.end());
    request.sampling = params;
    request.stream_interval = stream_interval;
    request.sink = sink;
    auto id = engine_->Submit(std::move(request));
    EXPECT_TRUE(id.ok()) << id.status();
    last_id_ = id.ok() ? *id : 0;
    if (!id.ok()) {
      // The engine sends a refused request nothing: end its sink here, with
      // the refusal, so that waiting on it fails the test instead of hanging.
      GenerationUpdate refused;
      refused.finished = true;
      refused.status = id.status();
      sink->OnUpdate(std::move(refused));
    }
    return sink;
  }
  // Submits a one-token prompt without keeping its sink: the status only.
  absl::Status SubmitOneToken() {
    GenerationRequest request;
    request.prompt = {1};
    request.sink = std::make_shared<CollectingSink>();
    return engine_->Submit(std::move(request)).status();
  }
  static SamplingParams Greedy(int n) {
    SamplingParams p;
    p.temperature = 0;
    p.max_new_tokens = n;
    return p;
  }

  std::unique_ptr<Tokenizer> tokenizer_ = CreateByteTokenizer();
  std::unique_ptr<testing::FakeBackend> backend_;
  std::unique_ptr<KvCache> kv_cache_;
  std::unique_ptr<GenerationEngine> engine_;
  RequestId last_id_ = 0;
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
