#include "engine/runtime/scheduler.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace switchserve {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void Init(int64_t blocks, int block_size, int64_t max_tokens, int max_running,
            bool prefix_caching = false, int64_t capacity_group = 0) {
    allocator_ = std::make_unique<KvBlockAllocator>(blocks, block_size, prefix_caching);
    scheduler_ = std::make_unique<Scheduler>(
        SchedulerConfig{max_tokens, max_running, capacity_group}, allocator_.get());
  }
  Sequence* Add(int prompt_len, int32_t priority = 0) {
    auto seq = std::make_unique<Sequence>();
    seq->id = static_cast<SequenceId>(seqs_.size() + 1);
    seq->arrival_order = seq->id;
    seq->priority = priority;
    seq->tokens.assign(prompt_len, 7);
    seq->prompt_tokens = prompt_len;
    scheduler_->Add(seq.get());
    seqs_.push_back(std::move(seq));
    return seqs_.back().get();
  }
  // Registers the first `count` blocks of `sequence` in the cache, each one
  // a sequence may start after (as the engine does after a step).
  void CacheFirstBlocks(const Sequence& sequence, int64_t count) {
    for (int64_t index = 0; index < count; ++index) {
      allocator_->CacheBlock(sequence.id, index, sequence.tokens, /*resumable=*/true, {});
    }
  }
  // Commits the step and "samples" a token for every chunk that reached its end.
  void Complete(const ScheduleResult& r) {
    scheduler_->CommitStep(r);
    for (const auto& c : r.chunks) {
      if (c.samples) c.sequence->tokens.push_back(1);
    }
  }

  std::unique_ptr<KvBlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

TEST_F(SchedulerTest, ChunksLongPromptUnderTokenBudget) {
  Init(100, 4, 8, 4);
  Sequence* a = Add(20);
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 1u);
  EXPECT_EQ(r.chunks[0].length, 8);
  EXPECT_FALSE(r.chunks[0].samples);
  Complete(r);
  r = scheduler_->Schedule();
  EXPECT_EQ(r.chunks[0].start, 8);
  Complete(r);
  r = scheduler_->Schedule();
  EXPECT_EQ(r.chunks[0].length, 4);
  EXPECT_TRUE(r.chunks[0].samples);
  Complete(r);
  EXPECT_EQ(a->tokens.size(), 21u);
  r = scheduler_->Schedule();  // decode
  EXPECT_EQ(r.decode_tokens, 1);
  EXPECT_EQ(r.chunks[0].start, 20);
}

// The last chunk of a prompt may be one token: it is prefill, not a decode
// (switchserve_prompt_tokens_total missed it: a 17-token prompt under a
// budget of 8 counted 16).
TEST_F(SchedulerTest, APromptsLastChunkOfOneTokenIsPrefill) {
  Init(100, 4, 8, 4);
  Add(17);
  int64_t prefill = 0, decode = 0;
  for (int step = 0; step < 4; ++step) {
    const ScheduleResult r = scheduler_->Schedule();
    prefill += r.prefill_tokens;
    decode += r.decode_tokens;
    Complete(r);
  }
  EXPECT_EQ(prefill, 17);  // 8 + 8 + 1
  EXPECT_EQ(decode, 1);    // the first generated token, decoded in the fourth step
}

TEST_F(SchedulerTest, DecodesFirstThenAdmitsInArrivalOrder) {
  Init(100, 4, 10, 8);
  Sequence* a = Add(3);
  Complete(scheduler_->Schedule());  // a prefilled, has its first token
  Sequence* b = Add(6);
  Sequence* c = Add(6);
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 3u);
  EXPECT_EQ(r.chunks[0].sequence, a);  // decode
  EXPECT_EQ(r.chunks[0].length, 1);
  EXPECT_EQ(r.chunks[1].sequence, b);
  EXPECT_EQ(r.chunks[1].length, 6);
  EXPECT_EQ(r.chunks[2].sequence, c);
  EXPECT_EQ(r.chunks[2].length, 3);  // what is left of the budget of 10
  EXPECT_EQ(r.num_tokens, 10);
}

TEST_F(SchedulerTest, RespectsMaxRunningRequests) {
  Init(100, 4, 100, 2);
  Add(2);
  Add(2);
  Sequence* c = Add(2);
  ScheduleResult r = scheduler_->Schedule();
  EXPECT_EQ(r.chunks.size(), 2u);
  EXPECT_EQ(scheduler_->waiting().front(), c);
}

TEST_F(SchedulerTest, AdmissionWaitsForFreeBlocksFcfs) {
  Init(4, 4, 100, 8);      // 16 tokens of cache
  Add(12);                 // 3 blocks
  Sequence* big = Add(8);  // 2 blocks: does not fit
  Add(2);                  // would fit, but FCFS keeps it behind `big`
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 1u);
  EXPECT_EQ(scheduler_->waiting().front(), big);
  EXPECT_EQ(scheduler_->waiting().size(), 2u);
  scheduler_->Remove(seqs_[0].get());
  EXPECT_EQ(allocator_->used_blocks(), 0);
  r = scheduler_->Schedule();
  EXPECT_EQ(r.chunks.size(), 2u);
}

TEST_F(SchedulerTest, PreemptsNewestByRecomputeWhenBlocksRunOut) {
  Init(3, 4, 100, 8);
  Sequence* a = Add(4);  // 1 block each: the cache is full
  Sequence* b = Add(4);
  Sequence* c = Add(4);
  Complete(scheduler_->Schedule());
  EXPECT_EQ(allocator_->free_blocks(), 0);
  // Every sequence now needs one more block for its decode token.
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.preempted.size(), 2u);
  EXPECT_EQ(r.preempted[0], c);  // newest first
  EXPECT_EQ(r.preempted[1], b);  // then b gives way to a, the oldest
  ASSERT_EQ(r.chunks.size(), 1u);
  EXPECT_EQ(r.chunks[0].sequence, a);
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_EQ(c->num_preemptions, 1);
  // Waiting queue stays in arrival order: b before c.
  ASSERT_EQ(scheduler_->waiting().size(), 2u);
  EXPECT_EQ(scheduler_->waiting()[0], b);
  Complete(r);
  scheduler_->Remove(a);
  r = scheduler_->Schedule();  // b recomputes prompt + its generated token
  ASSERT_GE(r.chunks.size(), 1u);
  EXPECT_EQ(r.chunks[0].sequence, b);
  EXPECT_EQ(r.chunks[0].start, 0);
  EXPECT_EQ(r.chunks[0].length, 5);
  EXPECT_TRUE(r.chunks[0].samples);
}

TEST_F(SchedulerTest, RemoveFreesBlocksOfRunningAndWaiting) {
  Init(10, 4, 100, 8);
  Sequence* a = Add(9);
  Sequence* b = Add(40);  // cannot fit while a runs
  scheduler_->Schedule();
  EXPECT_EQ(allocator_->used_blocks(), 3);
  scheduler_->Remove(a);
  scheduler_->Remove(b);
  EXPECT_EQ(allocator_->used_blocks(), 0);
  EXPECT_TRUE(scheduler_->running().empty());
  EXPECT_TRUE(scheduler_->waiting().empty());
}

// The admission rule alone, as GenerationEngine::Submit also applies it: in
// order, while budget and slots last, first chunks of min(tokens, budget left),
// up to the first that finds no KV room.
TEST(AdmitWaitingTest, TakesFirstChunksInOrderWhileBudgetSlotsAndRoomLast) {
  const std::vector<int64_t> tokens = {3, 5, 2, 1};
  std::vector<int64_t> chunks;
  auto tokens_left = [&](int64_t i) { return tokens[static_cast<size_t>(i)]; };
  auto fits = [&](int64_t, int64_t chunk) {
    chunks.push_back(chunk);
    return Admission::kAdmitted;
  };
  // The budget: 3, then the 3 left of 6 for the 5-token one; none for more.
  EXPECT_EQ(AdmitWaiting(4, /*token_budget=*/6, /*free_slots=*/8, tokens_left, fits), 2);
  EXPECT_EQ(chunks, (std::vector<int64_t>{3, 3}));
  chunks.clear();
  EXPECT_EQ(AdmitWaiting(4, 100, /*free_slots=*/3, tokens_left, fits), 3);
  EXPECT_EQ(chunks, (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(AdmitWaiting(4, /*token_budget=*/0, 8, tokens_left, fits), 0);
  EXPECT_EQ(AdmitWaiting(4, 100, /*free_slots=*/-1, tokens_left, fits), 0);
  // No room for the second: the ones behind it wait too (FCFS).
  chunks.clear();
  auto second_does_not_fit = [&](int64_t i, int64_t chunk) {
    chunks.push_back(chunk);
    return i != 1 ? Admission::kAdmitted : Admission::kNoRoom;
  };
  EXPECT_EQ(AdmitWaiting(4, 100, 8, tokens_left, second_does_not_fit), 1);
  EXPECT_EQ(chunks, (std::vector<int64_t>{3, 5}));
  // The second deferred: it takes no budget, the ones behind it join, but
  // it counts among the slots looked at.
  chunks.clear();
  std::vector<int64_t> admitted;
  auto second_deferred = [&](int64_t i, int64_t chunk) {
    chunks.push_back(chunk);
    if (i == 1) return Admission::kDeferred;
    admitted.push_back(i);
    return Admission::kAdmitted;
  };
  EXPECT_EQ(AdmitWaiting(4, /*token_budget=*/6, 8, tokens_left, second_deferred), 3);
  EXPECT_EQ(chunks, (std::vector<int64_t>{3, 3, 2, 1}));
  EXPECT_EQ(admitted, (std::vector<int64_t>{0, 2, 3}));
  admitted.clear();
  EXPECT_EQ(AdmitWaiting(4, 100, /*free_slots=*/3, tokens_left, second_deferred), 2);
  EXPECT_EQ(admitted, (std::vector<int64_t>{0, 2}));
}

// Priorities: the queue is ordered by priority, then arrival; a waiting
// sequence of a higher priority (lower value) than the last running one
// takes its running slot (it is preempted, and recomputed later); equal
// priorities keep arrival order and preempt nothing.
TEST_F(SchedulerTest, AHigherPriorityIsAdmittedFirstAndTakesTheLastRunningSlot) {
  Init(100, 4, 64, 2);
  Sequence* a = Add(4, /*priority=*/3);
  Sequence* b = Add(4, /*priority=*/3);
  Complete(scheduler_->Schedule());
  ASSERT_EQ(scheduler_->running().size(), 2u);
  Sequence* c = Add(4, /*priority=*/3);  // same priority: waits
  ScheduleResult r = scheduler_->Schedule();
  EXPECT_TRUE(r.preempted.empty());
  EXPECT_EQ(r.chunks.size(), 2u);
  Complete(r);
  Sequence* d = Add(4, /*priority=*/5);   // lower: waits behind c
  Sequence* e = Add(6, /*priority=*/-1);  // higher than every running one: takes b's slot
  r = scheduler_->Schedule();
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0], b);
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_EQ(b->num_preemptions, 1);
  ASSERT_EQ(r.chunks.size(), 2u);
  EXPECT_EQ(r.chunks[0].sequence, a);  // running, then admitted
  EXPECT_EQ(r.chunks[1].sequence, e);
  EXPECT_EQ(r.chunks[1].length, 6);
  // Running sequences in order: e first.
  EXPECT_EQ(scheduler_->running()[0], e);
  // The queue: b (3, arrived second), c (3), d (5).
  ASSERT_EQ(scheduler_->waiting().size(), 3u);
  EXPECT_EQ(scheduler_->waiting()[0], b);
  EXPECT_EQ(scheduler_->waiting()[1], c);
  EXPECT_EQ(scheduler_->waiting()[2], d);
}

// A higher priority also takes the KV blocks its first chunk needs.
TEST_F(SchedulerTest, AHigherPriorityTakesTheKvBlocksOfTheLastRunning) {
  Init(4, 4, 64, 8);
  Sequence* a = Add(8, /*priority=*/1);
  Sequence* b = Add(7, /*priority=*/2);  // holds 2 blocks
  Complete(scheduler_->Schedule());
  EXPECT_EQ(allocator_->free_blocks(), 0);
  Sequence* c = Add(4, /*priority=*/0);
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.preempted.size(), 1u);
  EXPECT_EQ(r.preempted[0], b);
  ASSERT_EQ(r.chunks.size(), 2u);
  EXPECT_EQ(r.chunks[0].sequence, a);
  EXPECT_EQ(r.chunks[1].sequence, c);
}

// Prefix caching: a sequence admitted after another with the same first
// blocks starts after them; one that may not use the cache, or whose every
// token is cached, still computes what it samples from.
TEST_F(SchedulerTest, AdmissionStartsAfterTheCachedPrefix) {
  Init(100, 4, 64, 4, /*prefix_caching=*/true);
  Sequence* a = Add(10);
  a->uses_prefix_cache = true;
  ScheduleResult r = scheduler_->Schedule();
  EXPECT_EQ(r.prefix_query_tokens, 10);
  EXPECT_EQ(r.prefix_hit_tokens, 0);
  Complete(r);
  CacheFirstBlocks(*a, 2);
  scheduler_->Remove(a);

  Sequence* b = Add(10);  // the same tokens
  b->uses_prefix_cache = true;
  Sequence* c = Add(10);
  c->uses_prefix_cache = false;
  Sequence* d = Add(8);  // all 8 cached: computes its last block's last token
  d->uses_prefix_cache = true;
  r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 3u);
  EXPECT_EQ(r.chunks[0].sequence, b);
  EXPECT_EQ(r.chunks[0].start, 8);
  EXPECT_EQ(r.chunks[0].length, 2);
  EXPECT_EQ(b->cached_tokens, 8);
  EXPECT_EQ(b->group_loads.next_position, 8);
  EXPECT_EQ(r.chunks[1].start, 0);
  EXPECT_EQ(r.chunks[1].length, 10);
  EXPECT_EQ(r.chunks[2].start, 4);
  EXPECT_EQ(r.chunks[2].length, 4);
  EXPECT_EQ(r.num_tokens, 16);
  EXPECT_EQ(r.prefill_tokens, 16);
  EXPECT_EQ(r.prefix_query_tokens, 18);  // c does not look
  EXPECT_EQ(r.prefix_hit_tokens, 12);
  EXPECT_EQ(allocator_->BlockTable(b->id)[0], allocator_->BlockTable(d->id)[0]);
}

// A sequence whose cached prefix is attached but whose own blocks do not fit
// waits, holding nothing.
TEST_F(SchedulerTest, ACachedPrefixIsReleasedWhenTheRestDoesNotFit) {
  Init(4, 4, 64, 4, /*prefix_caching=*/true);
  Sequence* a = Add(8);
  a->uses_prefix_cache = true;
  ScheduleResult r = scheduler_->Schedule();
  Complete(r);
  allocator_->CacheBlock(a->id, 0, a->tokens, /*resumable=*/true, {});
  Sequence* big = Add(12);  // holds 3 blocks, more than the 2 free
  big->uses_prefix_cache = true;
  big->tokens = a->tokens;
  big->tokens.resize(12, 5);
  r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 1u);  // a's decode
  EXPECT_EQ(r.chunks[0].sequence, a);
  EXPECT_FALSE(allocator_->Has(big->id));
  EXPECT_EQ(big->num_computed, 0);
  EXPECT_EQ(allocator_->used_blocks(), 3);  // a's 3; big holds a's first no more
}

// A cached chain that goes on past the last block a sequence may start
// after: the first chunk ends with the chain (so its step records the loads
// there), and the rest follows in the next step.
TEST_F(SchedulerTest, TheFirstChunkEndsWithTheCachedChain) {
  Init(100, 4, 64, 4, /*prefix_caching=*/true);
  Sequence* a = Add(14);
  a->uses_prefix_cache = true;
  Complete(scheduler_->Schedule());
  allocator_->CacheBlock(a->id, 0, a->tokens, /*resumable=*/true, {});
  allocator_->CacheBlock(a->id, 1, a->tokens, /*resumable=*/false, {});
  allocator_->CacheBlock(a->id, 2, a->tokens, /*resumable=*/false, {});
  scheduler_->Remove(a);

  Sequence* b = Add(14);
  b->uses_prefix_cache = true;
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 1u);
  EXPECT_EQ(r.chunks[0].start, 4);
  EXPECT_EQ(r.chunks[0].length, 8);  // to the chain's end, 12
  EXPECT_FALSE(r.chunks[0].samples);
  EXPECT_EQ(r.prefix_hit_tokens, 4);
  Complete(r);
  r = scheduler_->Schedule();
  EXPECT_EQ(r.chunks[0].start, 12);
  EXPECT_EQ(r.chunks[0].length, 2);
  EXPECT_TRUE(r.chunks[0].samples);
}

// Sequences behind one prefix that arrive together: the first computes it,
// the others wait until its blocks are cached and then start after them.
// Sequences that share no whole block with it, or that do not use the cache,
// are not held back.
TEST_F(SchedulerTest, ASequenceWaitsForTheBlocksAnotherIsComputing) {
  Init(100, 4, 64, 8, /*prefix_caching=*/true);
  Sequence* a = Add(10);
  Sequence* b = Add(10);  // the same tokens
  Sequence* c = Add(10);  // the same tokens, not using the cache
  Sequence* d = Add(10);  // differs in its first block
  d->tokens[2] = 9;
  Sequence* e = Add(4);  // could take no block: 3 tokens at most
  for (Sequence* s : {a, b, d, e}) s->uses_prefix_cache = true;
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 4u);
  EXPECT_EQ(r.chunks[0].sequence, a);
  EXPECT_EQ(r.chunks[1].sequence, c);
  EXPECT_EQ(r.chunks[2].sequence, d);
  EXPECT_EQ(r.chunks[3].sequence, e);
  ASSERT_EQ(scheduler_->waiting().size(), 1u);
  EXPECT_EQ(scheduler_->waiting()[0], b);
  EXPECT_EQ(r.prefix_query_tokens, 24);  // a, d, e; b's when it joins
  Complete(r);
  CacheFirstBlocks(*a, 2);
  r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 5u);
  EXPECT_EQ(r.chunks[4].sequence, b);
  EXPECT_EQ(r.chunks[4].start, 8);
  EXPECT_EQ(r.chunks[4].length, 2);
  EXPECT_EQ(b->cached_tokens, 8);
  EXPECT_EQ(r.prefix_hit_tokens, 8);
  EXPECT_TRUE(scheduler_->waiting().empty());
}

// Under capacity groups, where the blocks a waiting sequence shares with
// the one computing them end inside a group, that one's chunk ends there (its
// step records the group's loads at that block); at a group boundary, or
// without groups, it runs on.
TEST_F(SchedulerTest, TheChunkAnotherWaitsForEndsWithTheSharedBlocks) {
  for (int64_t group : {0, 8, 12}) {
    SCOPED_TRACE(group);
    Init(100, 4, 64, 8, /*prefix_caching=*/true, group);
    Sequence* a = Add(20);
    Sequence* b = Add(20);
    b->tokens[13] = 9;  // shares 13 tokens: 3 whole blocks, 12
    for (Sequence* s : {a, b}) s->uses_prefix_cache = true;
    ScheduleResult r = scheduler_->Schedule();
    ASSERT_EQ(r.chunks.size(), 1u);
    const int64_t end = group == 8 ? 12 : 20;
    EXPECT_EQ(r.chunks[0].length, end);
    EXPECT_EQ(r.chunks[0].samples, end == 20);
    EXPECT_EQ(r.num_tokens, end);
    EXPECT_EQ(r.prefill_tokens, end);
    Complete(r);
    EXPECT_EQ(a->num_computed, end);
    seqs_.clear();
  }
}

// A sequence waits for another computing its prompt's blocks only under the
// same salt (cache root): under another it could not take them.
TEST_F(SchedulerTest, OnlyASequenceUnderTheSameSaltIsDeferred) {
  for (const char* salt : {"", "tenant-b"}) {
    SCOPED_TRACE(salt);
    Init(100, 4, 64, 8, /*prefix_caching=*/true);
    Sequence* a = Add(10);
    Sequence* b = Add(10);
    for (Sequence* s : {a, b}) s->uses_prefix_cache = true;
    b->cache_root = KvBlockAllocator::RootOf(salt);
    ScheduleResult r = scheduler_->Schedule();
    ASSERT_EQ(r.chunks.size(), *salt == '\0' ? 1u : 2u);
    EXPECT_EQ(r.chunks[0].sequence, a);
    seqs_.clear();
  }
}

// A deferred sequence keeps its turn: no more are looked at than there are
// free running slots.
TEST_F(SchedulerTest, ADeferredSequenceTakesALookedAtSlot) {
  Init(100, 4, 64, 2, /*prefix_caching=*/true);
  Sequence* a = Add(10);
  Sequence* b = Add(10);
  Sequence* c = Add(10);
  c->tokens[0] = 9;
  for (Sequence* s : {a, b, c}) s->uses_prefix_cache = true;
  ScheduleResult r = scheduler_->Schedule();
  ASSERT_EQ(r.chunks.size(), 1u);
  EXPECT_EQ(r.chunks[0].sequence, a);
  EXPECT_EQ(scheduler_->waiting().size(), 2u);
}

}  // namespace
}  // namespace switchserve
