#include "engine/runtime/generation_engine.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/runtime/compute_threads.h"
#include "engine/runtime/sampler.h"
#include "engine/text/detokenizer.h"

namespace switchserve {
namespace {

double MillisBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// The scheduler's configuration: the engine's, with the capacity group taken
// from the dispatch (where a cached prefix may end; 0 when no group loads are
// carried).
SchedulerConfig SchedulerConfigOf(const EngineOptions& options) {
  SchedulerConfig config = options.scheduler;
  config.capacity_group =
      options.dispatch.CarriesGroupLoads() ? options.dispatch.capacity_group : 0;
  return config;
}

}  // namespace

// A request in the engine: the scheduler's view of it (Sequence) plus what
// generation needs.
struct GenerationEngine::RequestState : Sequence {
  RequestState(RequestId request_id, GenerationRequest r, const Tokenizer* tokenizer,
               std::optional<int32_t> eos_token_id)
      : request(std::move(r)),
        rng(request.sampling.seed),
        detokenizer(tokenizer, request.sampling.stop, request.prompt, request.sampling.min_tokens,
                    request.sampling.include_stop_str_in_output) {
    id = request_id;
    SamplingParams& sampling = request.sampling;
    if (sampling.min_tokens > 0) {
      std::vector<int32_t>& ids = sampling.min_tokens_ids;
      ids = sampling.stop_token_ids;
      if (eos_token_id && !sampling.ignore_eos) ids.push_back(*eos_token_id);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    }
    tokens = request.prompt;
    prompt_tokens = static_cast<int64_t>(tokens.size());
    // Scoring the prompt needs the logits of every position.
    uses_prefix_cache = request.sampling.prompt_logprobs < 0;
    cache_root = KvBlockAllocator::RootOf(request.cache_salt);
  }

  GenerationRequest request;
  SamplerRng rng;
  IncrementalDetokenizer detokenizer;
  int generated = 0;
  // With prompt logprobs: the next prompt position to score (the first has
  // nothing before it). A recompute after preemption does not score again.
  int64_t prompt_scored = 1;
  // Tokens sampled and not yet delivered (request.stream_interval).
  GenerationUpdate held;
  CancelCause cancelled = CancelCause::kNone;  // set: leaves at the next step
  bool done = false;
  std::optional<Clock::time_point> first_scheduled;
  std::optional<Clock::time_point> first_token;
};

GenerationEngine::RequestState* GenerationEngine::StateOf(Sequence* sequence) {
  return static_cast<RequestState*>(sequence);
}

GenerationEngine::GenerationEngine(const EngineOptions& options, Backend* backend,
                                   KvCache* kv_cache, const Tokenizer* tokenizer,
                                   EngineObserver* observer)
    : options_(options),
      backend_(backend),
      tokenizer_(tokenizer),
      observer_(observer),
      kv_cache_(kv_cache),
      allocator_(kv_cache->allocator()),
      scheduler_(SchedulerConfigOf(options), &allocator_) {
  snapshot_.total_blocks = kv_cache->num_blocks();
  snapshot_.block_size = kv_cache->block_size();
  snapshot_.prefix_caching = allocator_.prefix_caching();
}

GenerationEngine::~GenerationEngine() { Stop(); }

void GenerationEngine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = StartComputeThread([this] { Loop(); });
}

absl::Status GenerationEngine::CheckQueueRoomLocked(int32_t priority, bool* displaces) const {
  *displaces = false;
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  // Accepted requests the snapshot does not count yet, in arrival order: those
  // TakeInbox is handing to the scheduler, then the inbox.
  const int64_t in_transit = static_cast<int64_t>(in_transit_prompt_tokens_.size());
  const int64_t unpublished = in_transit + static_cast<int64_t>(inbox_.size());
  int64_t waiting = snapshot_.waiting + unpublished;
  // Those the next step admits do not wait: the scheduler's admission rule
  // over the published state (a running slot, what is left of the step's
  // token budget after a token for each running request, KV blocks for their
  // first chunk). None does while others wait already (the queue is FIFO).
  if (snapshot_.waiting == 0) {
    const SchedulerConfig& config = options_.scheduler;
    int64_t free_blocks = snapshot_.total_blocks - snapshot_.used_blocks;
    waiting -= AdmitWaiting(
        unpublished, config.max_batch_tokens - snapshot_.running,
        config.max_running_requests - snapshot_.running,
        [&](int64_t i) {
          return i < in_transit
                     ? in_transit_prompt_tokens_[static_cast<size_t>(i)]
                     : static_cast<int64_t>(
                           inbox_[static_cast<size_t>(i - in_transit)].second.prompt.size());
        },
        [&](int64_t, int64_t chunk) {
          const int64_t needed = (chunk + snapshot_.block_size - 1) / snapshot_.block_size;
          if (needed > free_blocks) return Admission::kNoRoom;
          free_blocks -= needed;
          return Admission::kAdmitted;
        });
  }
  if (waiting >= options_.max_queue) {
    // A waiting request of a worse priority, never admitted, gives way; the
    // snapshot says how many there are, less those already given away.
    if (priority < snapshot_.worst_fresh_priority &&
        static_cast<int>(displacing_.size()) < snapshot_.worst_fresh_count) {
      *displaces = true;
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("the request queue is full (", options_.max_queue,
                     " requests waiting, --max-queue); retry later"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestId> GenerationEngine::Submit(GenerationRequest request) {
  std::lock_guard<std::mutex> lock(mu_);
  bool displaces = false;
  if (absl::Status room = CheckQueueRoomLocked(request.priority, &displaces); !room.ok()) {
    return room;
  }
  if (displaces) displacing_.push_back(request.priority);
  const RequestId id = next_id_++;
  inbox_.emplace_back(id, std::move(request));
  wake_.notify_one();
  return id;
}

absl::StatusOr<std::vector<RequestId>> GenerationEngine::SubmitAll(
    std::vector<GenerationRequest> requests) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RequestId> ids;
  ids.reserve(requests.size());
  size_t displacing = 0;  // of these
  for (GenerationRequest& request : requests) {
    // Each is counted with those before it, as separate Submits would be.
    bool displaces = false;
    if (absl::Status room = CheckQueueRoomLocked(request.priority, &displaces); !room.ok()) {
      // The engine thread takes the inbox only under mu_: it has seen none
      // of these yet.
      inbox_.erase(inbox_.end() - static_cast<std::ptrdiff_t>(ids.size()), inbox_.end());
      displacing_.resize(displacing_.size() - displacing);
      return room;
    }
    if (displaces) {
      displacing_.push_back(request.priority);
      ++displacing;
    }
    ids.push_back(next_id_++);
    inbox_.emplace_back(ids.back(), std::move(request));
  }
  if (!ids.empty()) wake_.notify_one();
  return ids;
}

void GenerationEngine::Cancel(RequestId id, CancelCause cause) {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_inbox_.emplace_back(id, cause);
  wake_.notify_one();
}

void GenerationEngine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) {
    thread_.join();
  } else {
    TakeInbox();  // never started: still owe every accepted request its end
    for (auto& state : active_) {
      if (!state->done) {
        Finish(state.get(), FinishReason::kCancelled, absl::OkStatus(), CancelCause::kShutdown);
      }
    }
    active_.clear();
  }
}

EngineSnapshot GenerationEngine::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void GenerationEngine::Loop() {
  pthread_setname_np(pthread_self(), "engine");  // as `top -H` and perf show it
  while (TakeInbox()) {
    DropCancelledAndExpired();
    if (!active_.empty()) RunStep();
    PublishSnapshot();
  }
  for (auto& state : active_) {
    if (!state->done) {
      Finish(state.get(), FinishReason::kCancelled, absl::OkStatus(), CancelCause::kShutdown);
    }
  }
  active_.clear();
  PublishSnapshot();
}

bool GenerationEngine::TakeInbox() {
  std::deque<std::pair<RequestId, GenerationRequest>> inbox;
  std::vector<std::pair<RequestId, CancelCause>> cancels;
  std::vector<int32_t> displacing;
  bool keep_running;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (active_.empty()) {
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancel_inbox_.empty(); });
    }
    inbox.swap(inbox_);
    // Until PublishSnapshot counts them, Submit counts these from here.
    for (const auto& [id, request] : inbox) {
      in_transit_prompt_tokens_.push_back(static_cast<int64_t>(request.prompt.size()));
    }
    cancels.swap(cancel_inbox_);
    displacing.swap(displacing_);
    // Those given away stay given away until the snapshot counts again.
    snapshot_.worst_fresh_count -= static_cast<int>(displacing.size());
    keep_running = !stopping_;
  }
  for (auto& [id, request] : inbox) {
    auto state =
        std::make_unique<RequestState>(id, std::move(request), tokenizer_, options_.eos_token_id);
    state->arrival_order = next_arrival_++;
    state->priority = state->request.priority;
    scheduler_.Add(state.get());
    active_.push_back(std::move(state));
  }
  for (const auto& [id, cause] : cancels) {
    for (auto& state : active_) {
      if (state->id == id && state->cancelled == CancelCause::kNone) state->cancelled = cause;
    }
  }
  if (!displacing.empty()) Displace(displacing);
  // Submit counts waiting requests from the snapshot: publish before the
  // (long) step, which also ends their time in transit.
  if (!inbox.empty()) PublishSnapshot();
  return keep_running;
}

void GenerationEngine::Displace(const std::vector<int32_t>& displacing) {
  for (const int32_t priority : displacing) {
    // The waiting are in scheduling order: the worst priority, latest
    // arrival last. A request admitted before (preempted since) has begun
    // its answer; one being cancelled ends so anyway.
    const std::deque<Sequence*>& waiting = scheduler_.waiting();
    for (auto it = waiting.rbegin(); it != waiting.rend() && (*it)->priority > priority; ++it) {
      RequestState* state = StateOf(*it);
      if (state->first_scheduled || state->cancelled != CancelCause::kNone) continue;
      Finish(state, FinishReason::kNone,
             absl::ResourceExhaustedError(absl::StrCat(
                 "displaced from the full request queue (", options_.max_queue,
                 " requests waiting, --max-queue) by a request of a higher priority; retry "
                 "later")));
      break;
    }
  }
  std::erase_if(active_, [](const auto& state) { return state->done; });
}

void GenerationEngine::DropCancelledAndExpired() {
  const Clock::time_point now = Clock::now();
  for (auto& state : active_) {
    const auto& deadline = state->request.deadline;
    if (state->cancelled != CancelCause::kNone) {
      Finish(state.get(), FinishReason::kCancelled, absl::OkStatus(), state->cancelled);
    } else if (deadline && now >= *deadline) {
      Finish(state.get(), FinishReason::kCancelled, absl::OkStatus(), CancelCause::kDeadline);
    }
  }
  std::erase_if(active_, [](const auto& state) { return state->done; });
}

void GenerationEngine::RunStep() {
  const Clock::time_point t0 = Clock::now();
  ScheduleResult schedule = scheduler_.Schedule();
  if (schedule.chunks.empty()) {
    // Nothing can run (not expected: a lone request always fits). Do not spin;
    // new requests or cancellations wake the loop.
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, std::chrono::milliseconds(1));
    return;
  }
  // Admissions moved requests from waiting to running: publish before the
  // step emits their first tokens, so the queue limit (and clients watching
  // GetModelInfo) never see a running request as waiting.
  PublishSnapshot();

  batch_.Clear(allocator_.block_size());
  bool observed = false;
  for (const ScheduledChunk& chunk : schedule.chunks) {
    RequestState* state = StateOf(chunk.sequence);
    observed = observed || state->request.observed;
    if (!state->first_scheduled) state->first_scheduled = t0;
    StepSequence& sequence =
        batch_.Add(absl::MakeConstSpan(chunk.sequence->tokens).subspan(chunk.start, chunk.length),
                   static_cast<int32_t>(chunk.start), allocator_.BlockTable(chunk.sequence->id));
    sequence.group_loads = &chunk.sequence->group_loads;
    if (ScoresPrompt(*state, chunk)) sequence.logits = LogitsMode::kAll;
    if (chunk.samples) {
      const SamplingParams& params = state->request.sampling;
      sequence.sample = {&params, chunk.sequence->tokens, &state->rng,
                         chunk.sequence->prompt_tokens};
      sequence.collect_routing = params.return_routing;
    }
  }
  const Clock::time_point t1 = Clock::now();
  const absl::Status status = backend_->Forward(batch_, &step_output_);
  const Clock::time_point t2 = Clock::now();

  if (!status.ok()) {
    // The backend left the cache unchanged; the step's requests fail, the
    // rest carry on.
    for (const ScheduledChunk& chunk : schedule.chunks) {
      RequestState* state = StateOf(chunk.sequence);
      Finish(state, FinishReason::kNone, status);
    }
  } else {
    scheduler_.CommitStep(schedule);
    CacheComputedBlocks(schedule);
    ScorePrompts(schedule);
    for (SampledToken& sampled : step_output_.samples) {
      const ScheduledChunk& chunk = schedule.chunks[sampled.sequence];
      RequestState* state = StateOf(chunk.sequence);
      const SamplingParams& params = state->request.sampling;
      const int32_t token = sampled.sample.token_id;
      chunk.sequence->tokens.push_back(token);
      ++state->generated;
      if (!state->first_token) {
        state->first_token = Clock::now();
        if (observer_ != nullptr && state->request.observed) {
          const Clock::time_point arrival = state->request.arrival;
          observer_->OnFirstToken(state->request,
                                  MillisBetween(arrival, *state->first_scheduled) / 1e3,
                                  MillisBetween(arrival, *state->first_token) / 1e3);
        }
      }

      GenerationUpdate& update = state->held;
      GeneratedTokenInfo& info = update.tokens.emplace_back();
      info.token_id = token;
      info.logprob = sampled.sample.logprob;
      info.top_logprobs = std::move(sampled.sample.top_logprobs);
      if (params.return_routing) info.routing = std::move(sampled.routing);

      FinishReason reason = FinishReason::kNone;
      const auto& stop_ids = params.stop_token_ids;
      // The first min_tokens tokens end nothing (the sampler held the ids back).
      const bool may_stop = state->generated > params.min_tokens;
      if (may_stop && !params.ignore_eos && options_.eos_token_id &&
          token == *options_.eos_token_id) {
        reason = FinishReason::kEos;
      } else if (may_stop && std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
        reason = FinishReason::kStop;
        update.stop_token_id = token;
      }
      // The token that ends it adds its text only when asked to.
      if (reason == FinishReason::kNone || params.include_stop_str_in_output) {
        bool stopped = false;
        update.text += state->detokenizer.Add(token, &stopped);
        if (stopped && reason == FinishReason::kNone) reason = FinishReason::kStop;
      }
      if (reason == FinishReason::kNone &&
          (state->generated >= params.max_new_tokens ||
           static_cast<int64_t>(chunk.sequence->tokens.size()) >= options_.context_length)) {
        reason = FinishReason::kLength;
      }
      const int interval = state->request.stream_interval;
      if (reason != FinishReason::kNone) {
        Finish(state, reason, absl::OkStatus());
      } else if (interval > 0 &&
                 (state->generated == 1 || static_cast<int>(update.tokens.size()) >= interval)) {
        state->request.sink->OnUpdate(std::exchange(update, {}));
      }
    }
  }
  const Clock::time_point t3 = Clock::now();
  std::erase_if(active_, [](const auto& state) { return state->done; });

  if (observer_ != nullptr && observed) {
    StepReport report;
    report.num_sequences = static_cast<int>(schedule.chunks.size());
    report.num_tokens = schedule.num_tokens;
    report.prefill_tokens = schedule.prefill_tokens;
    report.decode_tokens = schedule.decode_tokens;
    report.prefix_query_tokens = schedule.prefix_query_tokens;
    report.prefix_hit_tokens = schedule.prefix_hit_tokens;
    report.priority_preempted = static_cast<int>(schedule.priority_preemptions);
    report.preempted = static_cast<int>(schedule.preempted.size()) - report.priority_preempted;
    report.running = static_cast<int>(scheduler_.running().size());
    report.waiting = static_cast<int>(scheduler_.waiting().size());
    report.used_blocks = allocator_.used_blocks();
    report.schedule_ms = MillisBetween(t0, t1);
    report.forward_ms = MillisBetween(t1, t2);
    report.update_ms = MillisBetween(t2, t3);
    report.routing = status.ok() ? &step_output_.stats : nullptr;
    observer_->OnStep(report);
  }
}

void GenerationEngine::CacheComputedBlocks(const ScheduleResult& schedule) {
  if (!allocator_.prefix_caching()) return;
  const DispatchConfig& dispatch = options_.dispatch;
  const bool carries = dispatch.CarriesGroupLoads();
  const int block = allocator_.block_size();
  for (const ScheduledChunk& chunk : schedule.chunks) {
    Sequence& sequence = *chunk.sequence;
    const int64_t end = sequence.num_computed;  // the chunk's end, committed
    for (int64_t index = allocator_.BlocksCached(sequence.id); (index + 1) * block <= end;
         ++index) {
      const int64_t block_end = (index + 1) * block;
      // A sequence may start after this block when its dispatch state there
      // is known: nothing carried, a group boundary, or the chunk's end,
      // whose group loads the step has just committed.
      const bool group_boundary = carries && block_end % dispatch.capacity_group == 0;
      const bool at_end = carries && block_end == end && sequence.group_loads.next_position == end;
      std::vector<int32_t> loads;
      if (at_end && !group_boundary) loads = sequence.group_loads.loads;
      allocator_.CacheBlock(sequence.id, index, sequence.tokens,
                            !carries || group_boundary || at_end, std::move(loads),
                            sequence.cache_root);
    }
  }
}

bool GenerationEngine::ScoresPrompt(const RequestState& state, const ScheduledChunk& chunk) {
  const int64_t prompt = static_cast<int64_t>(state.request.prompt.size());
  // Positions chunk.start ... predict the tokens after them.
  return state.request.sampling.prompt_logprobs >= 0 && state.prompt_scored < prompt &&
         chunk.start < prompt - 1 && chunk.start + chunk.length >= state.prompt_scored;
}

void GenerationEngine::ScorePrompts(const ScheduleResult& schedule) {
  const int32_t vocab = step_output_.vocab_size;
  for (size_t row = 0; row < step_output_.row_sequence.size(); ++row) {
    RequestState* state = StateOf(schedule.chunks[step_output_.row_sequence[row]].sequence);
    const std::vector<int32_t>& prompt = state->request.prompt;
    const int64_t next = int64_t{step_output_.row_position[row]} + 1;
    if (next != state->prompt_scored || next >= static_cast<int64_t>(prompt.size())) continue;
    SampleResult scored =
        TokenLogprobs(absl::MakeConstSpan(step_output_.logits).subspan(row * vocab, vocab),
                      prompt[next], state->request.sampling.prompt_logprobs);
    GeneratedTokenInfo& info = state->held.prompt_logprobs.emplace_back();
    info.token_id = prompt[next];
    info.logprob = scored.logprob;
    info.top_logprobs = std::move(scored.top_logprobs);
    info.rank = scored.rank;
    ++state->prompt_scored;
  }
}

void GenerationEngine::Finish(RequestState* state, FinishReason reason, absl::Status status,
                              CancelCause cause) {
  const Clock::time_point now = Clock::now();
  // A request whose deadline passed during its last step ends by its
  // deadline: its client has stopped waiting (gRPC ends the call there), so
  // it is not reported, counted or logged as a success the client never saw.
  const std::optional<Clock::time_point>& deadline = state->request.deadline;
  if (status.ok() && reason != FinishReason::kCancelled && deadline && now >= *deadline) {
    reason = FinishReason::kCancelled;
    cause = CancelCause::kDeadline;
  }
  // A request that ends early (cancelled, failed) first gets its held tokens
  // as an ordinary update, as it would have with an interval of 1.
  if ((!status.ok() || reason == FinishReason::kCancelled) && !state->held.tokens.empty()) {
    state->request.sink->OnUpdate(std::exchange(state->held, {}));
  }
  GenerationUpdate update = std::exchange(state->held, {});
  // Text still held back (an unfinished character, what may begin a stop
  // string) is released only by an end that decides it: a request cut short
  // ends with the text it had, as token by token.
  if (status.ok() && reason != FinishReason::kCancelled) {
    bool stopped = false;
    update.text += state->detokenizer.Finish(&stopped);
    // The final replacement character completed a stop string.
    if (stopped && reason == FinishReason::kLength) reason = FinishReason::kStop;
  }
  if (reason == FinishReason::kStop && update.stop_token_id < 0) {
    const int stop = state->detokenizer.stop_index();
    if (stop >= 0) update.stop_string = state->request.sampling.stop[static_cast<size_t>(stop)];
  }
  update.finished = true;
  update.finish_reason = reason;
  update.cancel_cause = reason == FinishReason::kCancelled ? cause : CancelCause::kNone;
  update.status = std::move(status);
  update.prompt_tokens = static_cast<int>(state->request.prompt.size());
  update.completion_tokens = state->generated;
  update.cached_prompt_tokens =
      static_cast<int>(std::min(state->cached_tokens, state->prompt_tokens));
  const Clock::time_point arrival = state->request.arrival;
  update.queue_ms = MillisBetween(arrival, state->first_scheduled.value_or(now));
  update.time_to_first_token_ms = MillisBetween(arrival, state->first_token.value_or(now));
  update.total_ms = MillisBetween(arrival, now);
  scheduler_.Remove(state);
  state->done = true;
  PublishSnapshot();  // a client that saw its request end sees its blocks freed
  if (observer_ != nullptr && state->request.observed) {
    observer_->OnRequestFinished(state->request, update);
  }
  state->request.sink->OnUpdate(std::move(update));
}

void GenerationEngine::PublishSnapshot() {
  // The worst priority among the waiting requests never admitted, and how
  // many have it, up to kMostDisplaced (as many as may give way before the
  // next snapshot): from the end of the queue, the worst priority's
  // requests, whatever the queue's length.
  constexpr int kMostDisplaced = 64;
  int32_t worst_fresh_priority = 0;
  int worst_fresh_count = 0;
  const std::deque<Sequence*>& waiting = scheduler_.waiting();
  for (auto it = waiting.rbegin(); it != waiting.rend() && worst_fresh_count < kMostDisplaced;
       ++it) {
    const RequestState* state = StateOf(*it);
    if (worst_fresh_count > 0 && state->priority != worst_fresh_priority) break;
    if (state->first_scheduled || state->cancelled != CancelCause::kNone) continue;
    worst_fresh_priority = state->priority;
    ++worst_fresh_count;
  }
  EngineSnapshot published;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_.worst_fresh_priority = worst_fresh_priority;
    snapshot_.worst_fresh_count = worst_fresh_count;
    snapshot_.running = static_cast<int>(scheduler_.running().size());
    snapshot_.waiting = static_cast<int>(scheduler_.waiting().size());
    snapshot_.used_blocks = allocator_.used_blocks();
    snapshot_.cached_blocks = allocator_.cached_free_blocks();
    // Every request taken from the inbox is the scheduler's by now (TakeInbox
    // publishes once it has handed them all over), so the snapshot counts it.
    in_transit_prompt_tokens_.clear();
    published = snapshot_;
  }
  if (observer_ != nullptr) observer_->OnStateChanged(published);
}

}  // namespace switchserve
