#include "engine/runtime/scheduler.h"

#include <algorithm>

namespace switchserve {
namespace {

// The scheduling order: priority (lower first), then arrival.
bool ComesBefore(const Sequence* a, const Sequence* b) {
  if (a->priority != b->priority) return a->priority < b->priority;
  return a->arrival_order < b->arrival_order;
}

}  // namespace

int64_t AdmitWaiting(int64_t num_waiting, int64_t token_budget, int64_t free_slots,
                     absl::FunctionRef<int64_t(int64_t)> tokens_left,
                     absl::FunctionRef<Admission(int64_t, int64_t)> try_admit) {
  int64_t admitted = 0;
  for (int64_t i = 0; i < num_waiting && i < free_slots && token_budget > 0; ++i) {
    const int64_t chunk = std::min(tokens_left(i), token_budget);
    const Admission admission = try_admit(i, chunk);
    if (admission == Admission::kNoRoom) break;
    if (admission == Admission::kAdmitted) {
      token_budget -= chunk;
      ++admitted;
    }
  }
  return admitted;
}

Scheduler::Scheduler(const SchedulerConfig& config, KvBlockAllocator* allocator)
    : config_(config), allocator_(allocator) {}

void Scheduler::Add(Sequence* sequence) {
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), sequence, ComesBefore),
                  sequence);
}

void Scheduler::Remove(Sequence* sequence) {
  if (auto it = std::find(running_.begin(), running_.end(), sequence); it != running_.end()) {
    running_.erase(it);
  }
  if (auto it = std::find(waiting_.begin(), waiting_.end(), sequence); it != waiting_.end()) {
    waiting_.erase(it);
  }
  allocator_->Free(sequence->id);
}

void Scheduler::Preempt(Sequence* sequence) {
  running_.erase(std::find(running_.begin(), running_.end(), sequence));
  allocator_->Free(sequence->id);
  sequence->num_computed = 0;
  ++sequence->num_preemptions;
  Add(sequence);
}

ScheduleResult Scheduler::Schedule() {
  ScheduleResult result;
  int64_t budget = config_.max_batch_tokens;
  auto schedule = [&](Sequence* sequence, int64_t length) {
    const int64_t total = static_cast<int64_t>(sequence->tokens.size());
    ScheduledChunk chunk{sequence, sequence->num_computed, length,
                         sequence->num_computed + length == total};
    // A chunk of one generated token is a decode step; anything else is
    // (re)computing a prompt, its last one-token chunk included.
    if (length == 1 && chunk.samples && total > sequence->prompt_tokens) {
      result.decode_tokens += length;
    } else {
      result.prefill_tokens += length;
    }
    result.num_tokens += length;
    budget -= length;
    result.chunks.push_back(chunk);
  };

  // 0. A waiting sequence of a higher priority than the last running one
  // takes the running slot and the KV blocks its first chunk needs from the
  // running sequences that come last.
  while (!waiting_.empty() && !running_.empty() &&
         waiting_.front()->priority < running_.back()->priority) {
    const Sequence* head = waiting_.front();
    const int64_t first_chunk = std::min(
        static_cast<int64_t>(head->tokens.size()) - head->num_computed, config_.max_batch_tokens);
    if (static_cast<int64_t>(running_.size()) < config_.max_running_requests &&
        allocator_->free_blocks() >= allocator_->BlocksFor(first_chunk)) {
      break;
    }
    Sequence* victim = running_.back();
    result.preempted.push_back(victim);
    Preempt(victim);
  }
  result.priority_preemptions = static_cast<int64_t>(result.preempted.size());

  // 1. Running sequences, first in the scheduling order first. Preemption
  // victims are taken from the other end, which this loop has not reached
  // yet.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* sequence = running_[i];
    const int64_t remaining =
        static_cast<int64_t>(sequence->tokens.size()) - sequence->num_computed;
    const int64_t length = std::min(remaining, budget);
    if (length <= 0) {
      ++i;
      continue;
    }
    bool preempted_self = false;
    while (!allocator_->Reserve(sequence->id, sequence->num_computed + length).ok()) {
      Sequence* victim = running_.back();
      result.preempted.push_back(victim);
      Preempt(victim);
      if (victim == sequence) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // it was the newest: nothing runs after it
    schedule(sequence, length);
    ++i;
  }

  // 2. Admit waiting sequences in order, unless the cache is so full that
  // running ones had to give way to each other this step.
  if (static_cast<int64_t>(result.preempted.size()) == result.priority_preemptions) {
    PrefixHit hit;                  // the cached prefix of the sequence tokens_left last saw
    std::vector<int64_t> admitted;  // indices into waiting_, ascending
    AdmitWaiting(
        static_cast<int64_t>(waiting_.size()), budget,
        config_.max_running_requests - static_cast<int64_t>(running_.size()),
        [&](int64_t i) {
          const Sequence* sequence = waiting_[static_cast<size_t>(i)];
          const int64_t total = static_cast<int64_t>(sequence->tokens.size());
          hit = {};
          if (sequence->uses_prefix_cache && sequence->num_computed == 0) {
            hit = allocator_->FindPrefix(sequence->tokens, total - 1, sequence->cache_root);
          }
          // Cached blocks past the last whose group loads are known: the
          // first chunk ends where they end, so that its step records the
          // loads there and the next sequence with this prefix takes all of
          // it.
          if (hit.matched > hit.tokens) return hit.matched - hit.tokens;
          return total - sequence->num_computed - hit.tokens;
        },
        [&](int64_t i, int64_t length) {
          Sequence* sequence = waiting_[static_cast<size_t>(i)];
          if (sequence->uses_prefix_cache && sequence->num_computed == 0 &&
              allocator_->prefix_caching()) {
            if (const Sequence* other = AnotherComputes(*sequence, hit.tokens)) {
              EndChunkWithSharedBlocks(*sequence, *other, &result);
              return Admission::kDeferred;
            }
          }
          allocator_->AttachPrefix(sequence->id, hit);
          if (!allocator_->Reserve(sequence->id, hit.tokens + length).ok()) {
            allocator_->Free(sequence->id);
            return Admission::kNoRoom;
          }
          if (sequence->uses_prefix_cache && allocator_->prefix_caching()) {
            result.prefix_query_tokens += static_cast<int64_t>(sequence->tokens.size());
            result.prefix_hit_tokens += hit.tokens;
          }
          sequence->cached_tokens = hit.tokens;
          if (hit.tokens > 0) {
            sequence->num_computed = hit.tokens;
            sequence->group_loads = {hit.tokens, std::move(hit.loads)};
          }
          running_.insert(std::upper_bound(running_.begin(), running_.end(), sequence, ComesBefore),
                          sequence);
          schedule(sequence, length);
          admitted.push_back(i);
          return Admission::kAdmitted;
        });
    for (auto it = admitted.rbegin(); it != admitted.rend(); ++it) {
      waiting_.erase(waiting_.begin() + *it);
    }
  }
  return result;
}

Sequence* Scheduler::AnotherComputes(const Sequence& sequence, int64_t from) const {
  const int64_t end = from + allocator_->block_size();
  // Only a block it could take from the cache (not the one its first token
  // is sampled from).
  if (end > static_cast<int64_t>(sequence.tokens.size()) - 1) return nullptr;
  const auto first = sequence.tokens.begin();
  for (Sequence* other : running_) {
    if (other->num_computed >= end || static_cast<int64_t>(other->tokens.size()) < end ||
        other->cache_root != sequence.cache_root) {
      continue;
    }
    // The block itself first: sequences behind one shared prefix differ after it.
    if (std::equal(first + from, first + end, other->tokens.begin() + from) &&
        std::equal(first, first + from, other->tokens.begin())) {
      return other;
    }
  }
  return nullptr;
}

void Scheduler::EndChunkWithSharedBlocks(const Sequence& waiting, const Sequence& other,
                                         ScheduleResult* result) const {
  const int64_t group = config_.capacity_group;
  if (group <= 0) return;  // any cached block may start a sequence
  const int64_t block = allocator_->block_size();
  // The whole blocks `waiting` could take (all but its last token at most).
  const int64_t limit = std::min(static_cast<int64_t>(waiting.tokens.size()) - 1,
                                 static_cast<int64_t>(other.tokens.size()));
  const int64_t common =
      std::mismatch(waiting.tokens.begin(), waiting.tokens.begin() + limit, other.tokens.begin())
          .first -
      waiting.tokens.begin();
  const int64_t shared_end = common / block * block;
  if (shared_end % group == 0) return;  // a group boundary: its loads are known
  for (ScheduledChunk& chunk : result->chunks) {
    if (chunk.sequence != &other) continue;
    const int64_t past = chunk.start + chunk.length - shared_end;
    if (shared_end <= chunk.start || past <= 0) return;
    chunk.length -= past;
    chunk.samples = false;
    result->num_tokens -= past;
    result->prefill_tokens -= past;
    return;
  }
}

void Scheduler::CommitStep(const ScheduleResult& result) {
  for (const ScheduledChunk& chunk : result.chunks) {
    chunk.sequence->num_computed = chunk.start + chunk.length;
  }
}

}  // namespace switchserve
