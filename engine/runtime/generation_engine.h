// The engine loop: a thread that drives the backend, the KV block accounting
// and the scheduler, and turns submitted GenerationRequests into GenerationUpdates.
// Each iteration: take new requests and cancellations, drop requests that were
// cancelled or whose deadline passed (freeing their blocks), ask the Scheduler
// for the next step, run it on the backend (which samples a token for every
// sequence that reached its end), detokenize, check stop conditions and send
// updates.
//
// Thread-safe: Submit, Cancel, Snapshot and Stop may be called from any thread
// (gRPC handlers); all engine work happens on the engine thread.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_GENERATION_ENGINE_H_
#define SWITCHSERVE_ENGINE_RUNTIME_GENERATION_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/request.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/scheduler.h"
#include "engine/text/tokenizer.h"

namespace switchserve {

struct EngineOptions {
  SchedulerConfig scheduler;
  int max_queue = 1024;  // requests waiting for admission; more: RESOURCE_EXHAUSTED
  // A sequence ends (kLength) once it holds this many tokens, prompt
  // included: the model's max_seq_len for the server.
  int context_length = 0;
  std::optional<int32_t> eos_token_id;
  // The backend's dispatch: with prefix caching, where a cached prefix may
  // end (a capacity-group boundary, or where the group's loads are known).
  DispatchConfig dispatch;
};

// What one engine step did; the seam for metrics (timings, batch shape,
// routing statistics).
struct StepReport {
  int num_sequences = 0;
  int64_t num_tokens = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  // Prefix caching: prompt (and recomputed) tokens of the admitted sequences
  // looked up in the cache, and those found there (not computed).
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int preempted = 0;           // for KV blocks
  int priority_preempted = 0;  // for a waiting request of a higher priority
  int running = 0;             // after the step
  int waiting = 0;
  int64_t used_blocks = 0;
  double schedule_ms = 0;
  double forward_ms = 0;  // the backend's step, sampling included
  double update_ms = 0;   // turning the samples into updates (detokenizing, stop checks)
  const StepRoutingStats* routing = nullptr;  // valid during OnStep only
};

struct EngineSnapshot {
  int running = 0;
  int waiting = 0;  // admitted to the queue, not yet in the batch
  int64_t used_blocks = 0;
  int64_t total_blocks = 0;
  int block_size = 0;
  bool prefix_caching = false;
  int64_t cached_blocks = 0;  // held by no request, keeping a cached prefix (free)
  // The worst (highest) priority among waiting requests never admitted yet,
  // and how many of those have it: requests a request of a better priority
  // may displace from a full queue (GenerationEngine::Submit).
  int32_t worst_fresh_priority = 0;
  int worst_fresh_count = 0;
};

// Called on the engine thread; must be quick and must not call back into the
// engine.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnStep(const StepReport& report) = 0;
  // `request` is the request as submitted (its origin, prompt, sampling).
  virtual void OnRequestFinished(const GenerationRequest& request,
                                 const GenerationUpdate& final_update) {
    (void)request;
    (void)final_update;
  }
  // `request` produced its first token, `first_token_seconds` after its
  // arrival, `queue_seconds` after which it was first scheduled; once per
  // request, in the step that sampled it (not when the request ends).
  virtual void OnFirstToken(const GenerationRequest& request, double queue_seconds,
                            double first_token_seconds) {
    (void)request;
    (void)queue_seconds;
    (void)first_token_seconds;
  }
  // The running and waiting counts or the used blocks may have changed: after
  // every step, and between steps when requests arrive, end or are dropped
  // (cancelled, past their deadline) while the engine is idle. Unobserved
  // requests included (GenerationRequest::observed): this is the engine's
  // state, not a request's.
  virtual void OnStateChanged(const EngineSnapshot& snapshot) { (void)snapshot; }
};

using RequestId = int64_t;

class GenerationEngine {
 public:
  // `backend`, `kv_cache` (the backend's, see KvCache::Create), `tokenizer`
  // and `observer` (may be null) must outlive the engine.
  GenerationEngine(const EngineOptions& options, Backend* backend, KvCache* kv_cache,
                   const Tokenizer* tokenizer, EngineObserver* observer);
  ~GenerationEngine();  // Stop()

  GenerationEngine(const GenerationEngine&) = delete;
  GenerationEngine& operator=(const GenerationEngine&) = delete;

  void Start();
  // Queues a request. RESOURCE_EXHAUSTED when max_queue requests are already
  // waiting, unless some of them were never admitted and have a worse
  // priority than this one's: then the engine ends the latest of the worst
  // of those with RESOURCE_EXHAUSTED ("displaced"), so that a full queue of
  // background requests does not refuse a foreground one. UNAVAILABLE once
  // Stop has been called. On error the sink gets no update.
  absl::StatusOr<RequestId> Submit(GenerationRequest request);
  // Queues every request of `requests` (in order; their ids in that order)
  // or none: the refusal of the first that would not fit, as Submit's, and
  // then no request is queued, none is seen by the engine or its observer,
  // and no sink gets an update. For a client request of several prompts, so
  // that one refused leaves no trace in the queue or the metrics.
  absl::StatusOr<std::vector<RequestId>> SubmitAll(std::vector<GenerationRequest> requests);
  // The request leaves the batch at the next step and finishes with
  // FinishReason::kCancelled and `cause` (kClient or kDeadline; a request
  // whose own deadline passes, or that Stop ends, gets its cause from the
  // engine). Unknown or finished ids are ignored.
  void Cancel(RequestId id, CancelCause cause = CancelCause::kClient);
  // Cancels every remaining request (each gets its final update) and joins
  // the engine thread. Idempotent.
  void Stop();

  EngineSnapshot Snapshot() const;

 private:
  struct RequestState;
  // The engine adds only RequestStates to its scheduler, so every Sequence
  // the scheduler hands back is one.
  static RequestState* StateOf(Sequence* sequence);

  void Loop();
  // Whether one more request of `priority` may be queued now, counting
  // those in inbox_: Submit's refusal, or OK; `*displaces` when it takes the
  // place of a waiting one of a worse priority (displacing_). Called with
  // mu_ held.
  absl::Status CheckQueueRoomLocked(int32_t priority, bool* displaces) const;
  // Ends, for each priority in `displacing`, the latest waiting request
  // never admitted whose priority is worse, if one is left (Submit).
  void Displace(const std::vector<int32_t>& displacing);
  // Moves submissions and cancellations into the engine's own state. Returns
  // false when the engine should exit.
  bool TakeInbox();
  void DropCancelledAndExpired();
  void RunStep();
  // Whether `chunk` of `state` returns every position's logits: the request
  // asks for its prompt's logprobs and the chunk predicts some not yet
  // scored.
  static bool ScoresPrompt(const RequestState& state, const ScheduledChunk& chunk);
  // Adds the logprobs of the prompt tokens the step's rows predict to their
  // requests' held updates.
  void ScorePrompts(const ScheduleResult& schedule);
  // Registers the blocks the step filled in the prefix cache.
  void CacheComputedBlocks(const ScheduleResult& schedule);
  // Delivers the request's final update (with the tokens it still holds).
  void Finish(RequestState* state, FinishReason reason, absl::Status status,
              CancelCause cause = CancelCause::kNone);
  void PublishSnapshot();

  const EngineOptions options_;
  Backend* const backend_;
  const Tokenizer* const tokenizer_;
  EngineObserver* const observer_;
  KvCache* const kv_cache_;
  KvBlockAllocator& allocator_;  // kv_cache_'s
  Scheduler scheduler_;

  // Engine-thread state.
  std::vector<std::unique_ptr<RequestState>> active_;
  int64_t next_arrival_ = 0;
  StepBatch batch_;
  StepOutput step_output_;

  // Shared with callers, guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<RequestId, GenerationRequest>> inbox_;
  // The prompt lengths of the requests TakeInbox has taken from inbox_ and
  // snapshot_ does not count yet (it builds their state outside the lock), in
  // arrival order: Submit counts them, as queued ahead of inbox_.
  std::vector<int64_t> in_transit_prompt_tokens_;
  std::vector<std::pair<RequestId, CancelCause>> cancel_inbox_;
  // The priorities of requests queued past max_queue, each owed the
  // displacement of a waiting request of a worse priority (TakeInbox).
  std::vector<int32_t> displacing_;
  RequestId next_id_ = 1;
  bool stopping_ = false;
  EngineSnapshot snapshot_;

  std::thread thread_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_GENERATION_ENGINE_H_
