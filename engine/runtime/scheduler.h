// Continuous-batching scheduling policy (iteration level, priority then
// FCFS, chunked prefill, preemption by recompute). Sequences are kept in the
// scheduling order: priority (lower first; all 0 unless the server schedules
// by priority), then arrival. Each call to Schedule() decides what the next
// engine step computes:
//
//  0. While the first waiting sequence has a higher priority than the last
//     running one and finds no free running slot or not the KV blocks for its
//     first chunk, the last running sequence is preempted.
//  1. Running sequences, in order, get their next chunk: one decode token,
//     or the rest of a prefill (chunked to what is left of the token budget).
//     When the KV cache has no room for a chunk, the last running sequence
//     is preempted: its blocks are freed and it goes back to the waiting queue
//     to be recomputed from scratch (prompt + tokens generated so far).
//  2. If nothing was preempted in 1, waiting sequences are admitted in order
//     while the token budget (max_batch_tokens), the running limit
//     (max_running_requests) and the free KV blocks allow; a long prompt is
//     admitted with a first chunk and continues in later steps. A waiting
//     sequence that does not fit blocks the ones behind it.
//     With prefix caching, an admitted sequence first takes the cached
//     blocks of the longest cached prefix of its tokens (all but the last
//     token at most: a step must compute the token it samples from) and
//     computes from there. Where the cached chain goes on past the last
//     block a sequence may start after (its capacity group's loads unknown
//     there), the first chunk ends with the chain, so that the step records
//     the loads at its end and later sequences take the whole chain. A
//     sequence whose next block past its cached prefix a running sequence is
//     about to compute (the same tokens from position 0 under the same
//     salt, GenerationRequest::cache_salt; one admitted this step, or one
//     still computing its prompt) is deferred until that block is cached,
//     so that sequences arriving together behind one prefix (a request's n
//     choices, a burst behind one system prompt) compute it once;
//     the ones behind it may join meanwhile, but no more sequences are looked
//     at than there are free running slots, so it keeps its turn. Where the
//     blocks they share end inside a capacity group (`capacity_group`), the
//     other's chunk this step ends there, so that its step records the
//     group's loads at that block and the waiting one may start after it.
//
// The scheduler owns the order of sequences and their KV block reservations
// (through KvBlockAllocator) and never touches tensors; the engine owns the
// Sequence objects, runs the backend and samples.
//
// Thread-compatible: the engine thread owns it.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_SCHEDULER_H_
#define SWITCHSERVE_ENGINE_RUNTIME_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/functional/function_ref.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/step_batch.h"

namespace switchserve {

struct SchedulerConfig {
  int64_t max_batch_tokens = 2048;  // tokens computed per step, >= 1
  int max_running_requests = 64;    // sequences in the batch, >= 1
  // Prefix caching under the sequence capacity scope with a capacity limit
  // (DispatchConfig::CarriesGroupLoads): the capacity group. A sequence may
  // start after a cached block that ends at a multiple of it, or where a
  // step's chunk ended (its group loads recorded there). 0: after any block.
  int64_t capacity_group = 0;
};

// The scheduler's view of a sequence. `tokens` holds the prompt followed by
// the tokens generated so far; the first `num_computed` are in the KV cache.
struct Sequence {
  SequenceId id = 0;
  int64_t arrival_order = 0;  // lower arrived first
  // Lower is scheduled first (vLLM's convention); among equals, arrival.
  int32_t priority = 0;
  std::vector<int32_t> tokens;
  int64_t prompt_tokens = 0;  // the first tokens, the prompt; the rest were generated
  int64_t num_computed = 0;
  int num_preemptions = 0;
  // Whether admission may start it from a cached prefix (KvCacheOptions::
  // prefix_caching); not for a request that needs every prompt position's
  // logits.
  bool uses_prefix_cache = false;
  // The chain its cached blocks hang from (KvBlockAllocator::RootOf its
  // salt): it takes cached blocks only from sequences with the same root.
  uint64_t cache_root = 0;
  // Tokens its latest admission found in the cache.
  int64_t cached_tokens = 0;
  // Its capacity groups' loads under the sequence scope (StepSequence::
  // group_loads); admission from a cached prefix sets the prefix's.
  GroupLoads group_loads;
};

// A chunk of one sequence to compute this step: tokens[start, start+length).
// When it reaches the end of the sequence (`samples`), the step produces the
// sequence's next token.
struct ScheduledChunk {
  Sequence* sequence = nullptr;
  int64_t start = 0;
  int64_t length = 0;
  bool samples = false;
};

struct ScheduleResult {
  std::vector<ScheduledChunk> chunks;  // running ones first, each group in order
  std::vector<Sequence*> preempted;    // moved back to the waiting queue
  // How many of `preempted`, the first ones, gave way to a waiting sequence
  // of a higher priority (the rest to running ones, for KV blocks).
  int64_t priority_preemptions = 0;
  int64_t num_tokens = 0;  // sum of chunk lengths
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  // Prefix caching: the tokens of the sequences admitted from the cache's
  // lookups, and those the cache held (not computed, not in num_tokens).
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
};

// What admission did with a waiting sequence.
enum class Admission {
  kAdmitted,  // it joins the step with its first chunk
  kDeferred,  // it waits for a later step; the ones behind it may join
  kNoRoom,    // no KV blocks for its first chunk: it and the ones behind it wait
};

// Step 2 of Schedule(), the admission rule: waiting sequences are looked at in
// the queue's order, each with a first chunk of min(its tokens left to compute,
// the step's token budget left), while budget is left and fewer have been
// looked at than there are free running slots; `try_admit(i, chunk)` admits
// the i-th (KV blocks found for its chunk), defers it (it keeps its place but
// takes no budget) or finds no room, which stops admission (FCFS).
// `tokens_left(i)` is what the i-th of the `num_waiting` sequences has left
// to compute. Returns how many joined. GenerationEngine::Submit applies the
// same rule to the queue it sees (deferring none), to tell the requests that
// join the next step from those that must wait.
int64_t AdmitWaiting(int64_t num_waiting, int64_t token_budget, int64_t free_slots,
                     absl::FunctionRef<int64_t(int64_t)> tokens_left,
                     absl::FunctionRef<Admission(int64_t, int64_t)> try_admit);

class Scheduler {
 public:
  // `allocator` must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, KvBlockAllocator* allocator);

  // Queues a new sequence (not owned; must stay alive until Remove).
  void Add(Sequence* sequence);
  // Takes a sequence out of the queues and frees its KV blocks (finished,
  // cancelled or failed). Unknown sequences are ignored.
  void Remove(Sequence* sequence);

  ScheduleResult Schedule();
  // Marks the chunks of `result` as computed (after a successful step).
  void CommitStep(const ScheduleResult& result);

  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const KvBlockAllocator& allocator() const { return *allocator_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void Preempt(Sequence* sequence);
  // A running sequence that has the same tokens as `sequence` through the
  // block starting at `from` (a block `sequence` could take from the cache)
  // and has not computed that block yet: it will, and cache it. Null if none.
  Sequence* AnotherComputes(const Sequence& sequence, int64_t from) const;
  // `waiting` waits for blocks `other` computes: where the whole blocks they
  // share end inside a capacity group, and `other`'s chunk this step goes on
  // past that end, the chunk ends there instead (in `result`).
  void EndChunkWithSharedBlocks(const Sequence& waiting, const Sequence& other,
                                ScheduleResult* result) const;

  SchedulerConfig config_;
  KvBlockAllocator* allocator_;
  // Both in the scheduling order: priority, then arrival_order.
  std::vector<Sequence*> running_;
  std::deque<Sequence*> waiting_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_SCHEDULER_H_
