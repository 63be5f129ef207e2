// The CPU backend's worker pool: every piece of every job runs exactly once,
// Run returns only when all have finished, and pools come and go cleanly.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {
namespace {

TEST(WorkerPoolTest, EveryPieceRunsOnceAndIsDoneWhenRunReturns) {
  for (int threads : {1, 2, 3}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int job = 0; job < 2000; ++job) {
      const int count = job % 37;
      std::vector<std::atomic<int>> runs(count);
      pool.Run(count, [&](int i, int slot) {
        EXPECT_TRUE(slot >= 0 && slot < threads) << slot;
        if (job % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        runs[i].fetch_add(1);
      });
      for (int i = 0; i < count; ++i) {
        ASSERT_EQ(runs[i].load(), 1) << "threads " << threads << " job " << job << " piece " << i;
      }
    }
  }
}

// A job of more pieces than a share numbers (2^16 - 1) runs as several,
// every piece once.
TEST(WorkerPoolTest, JobsOfMorePiecesThanAShareNumbersRunEveryPieceOnce) {
  WorkerPool pool(2);
  constexpr int kCount = 3 * 65535 + 7;
  std::vector<std::atomic<int>> runs(kCount);
  pool.Run(kCount, [&](int i, int) { runs[i].fetch_add(1); });
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
}

// Each thread runs its own share first: with the caller held in its first
// piece, the worker runs the pieces of its own share in order, before any
// of the caller's.
TEST(WorkerPoolTest, EachThreadRunsItsOwnShareFirst) {
  WorkerPool pool(2);
  for (int round = 0; round < 20; ++round) {
    constexpr int kCount = 8;
    std::atomic<int> worker_pieces{0};
    std::mutex order_mutex;
    std::vector<int> worker_order;
    pool.Run(kCount, [&](int i, int slot) {
      if (slot != 0) {
        std::lock_guard<std::mutex> lock(order_mutex);
        worker_order.push_back(i);
        worker_pieces.fetch_add(1);
        return;
      }
      // The caller's first piece waits for the worker's whole share.
      if (i == 0) {
        while (worker_pieces.load() < kCount / 2) std::this_thread::yield();
      }
    });
    ASSERT_GE(worker_order.size(), static_cast<size_t>(kCount / 2)) << "round " << round;
    for (int j = 0; j < kCount / 2; ++j) {
      EXPECT_EQ(worker_order[j], kCount / 2 + j) << "round " << round;
    }
  }
}

TEST(WorkerPoolTest, WorkersTakePiecesWhenTheCallerIsBusy) {
  WorkerPool pool(2);
  // Each piece holds its thread until both have started: the job can only
  // finish if a second thread takes the piece the first is not running.
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> started{0};
    std::set<std::thread::id> ids;
    std::mutex ids_mutex;
    std::set<int> slots;
    pool.Run(2, [&](int, int slot) {
      {
        std::lock_guard<std::mutex> lock(ids_mutex);
        ids.insert(std::this_thread::get_id());
        slots.insert(slot);
      }
      started.fetch_add(1);
      while (started.load() < 2) std::this_thread::yield();
    });
    EXPECT_EQ(started.load(), 2);
    EXPECT_EQ(ids.size(), 2u);
    EXPECT_EQ(slots, (std::set<int>{0, 1})) << "each thread has its own slot";
  }
}

TEST(WorkerPoolTest, PoolsStartAndStopCleanly) {
  // Destroyed before, while and after workers go to sleep: none may hang.
  for (int i = 0; i < 200; ++i) {
    WorkerPool pool(3);
    if (i % 3 == 1) pool.Run(5, [](int, int) {});
    if (i % 50 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(WorkerPoolTest, SleepingWorkersWakeForTheNextJob) {
  WorkerPool pool(2);
  for (int round = 0; round < 5; ++round) {
    // Long enough for the worker to stop polling and sleep.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // Each piece waits until both have started: only a worker that woke
    // can start the second.
    std::atomic<int> started{0};
    pool.Run(2, [&](int, int) {
      started.fetch_add(1);
      while (started.load() < 2) std::this_thread::yield();
    });
    EXPECT_EQ(started.load(), 2);
  }
}

TEST(WorkerPoolTest, RestingWorkersStillTakePartInTheNextJob) {
  WorkerPool pool(2);
  for (int round = 0; round < 20; ++round) {
    pool.Rest();
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Each piece waits until both have started: the job finishes only if
    // the resting worker wakes and takes a piece.
    std::atomic<int> started{0};
    std::set<int> slots;
    std::mutex slots_mutex;
    pool.Run(2, [&](int, int slot) {
      {
        std::lock_guard<std::mutex> lock(slots_mutex);
        slots.insert(slot);
      }
      started.fetch_add(1);
      while (started.load() < 2) std::this_thread::yield();
    });
    EXPECT_EQ(started.load(), 2);
    EXPECT_EQ(slots, (std::set<int>{0, 1})) << "round " << round;
  }
}

// RecordJobs: one span per job shared out, in order, with its pieces, the
// caller's share of them, a start no later than the end and, between them,
// when the caller and the workers ran out of pieces (0 for workers that took
// none); nothing for a job of one piece or a pool of one thread, and nothing
// once it is off.
TEST(WorkerPoolTest, RecordJobsListsEverySharedJob) {
  WorkerPool pool(2), alone(1);
  std::vector<PoolJobSpan> spans;
  WorkerPool::RecordJobs(&spans);
  for (int count : {2, 1, 8, 5}) {
    std::atomic<int> ran{0};
    pool.Run(count, [&](int, int) { ran.fetch_add(1); });
    ASSERT_EQ(ran.load(), count);
  }
  alone.Run(4, [](int, int) {});
  WorkerPool::RecordJobs(nullptr);
  pool.Run(3, [](int, int) {});

  ASSERT_EQ(spans.size(), 3u);
  const int pieces[] = {2, 8, 5};
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].pieces, pieces[i]) << i;
    EXPECT_GE(spans[i].caller_pieces, 0) << i;
    EXPECT_LE(spans[i].caller_pieces, spans[i].pieces) << i;
    EXPECT_LE(spans[i].start_ns, spans[i].end_ns) << i;
    EXPECT_LE(spans[i].start_ns, spans[i].caller_end_ns) << i;
    EXPECT_LE(spans[i].caller_end_ns, spans[i].end_ns) << i;
    if (spans[i].caller_pieces < spans[i].pieces) {
      EXPECT_LE(spans[i].start_ns, spans[i].workers_end_ns) << i;
      EXPECT_LE(spans[i].workers_end_ns, spans[i].end_ns) << i;
    } else {
      EXPECT_EQ(spans[i].workers_end_ns, 0) << i;
    }
    if (i > 0) {
      EXPECT_LE(spans[i - 1].end_ns, spans[i].start_ns) << i;
    }
  }
}

// The caller's share is what it ran: a job whose pieces only a worker can
// run (the caller's first piece waits for all the others) records one. The
// worker's pieces wait for the caller to be in its first, so the worker
// cannot take them all before the caller takes one, however the threads are
// scheduled.
TEST(WorkerPoolTest, RecordJobsCountsTheCallersPieces) {
  WorkerPool pool(2);
  std::vector<PoolJobSpan> spans;
  WorkerPool::RecordJobs(&spans);
  const int count = 6;
  std::atomic<int> others{0};
  std::atomic<bool> caller_in{false};
  const std::thread::id caller = std::this_thread::get_id();
  pool.Run(count, [&](int, int) {
    if (std::this_thread::get_id() == caller && !caller_in.exchange(true)) {
      // Hold the caller in its first piece until the worker ran the rest.
      while (others.load() < count - 1) std::this_thread::yield();
    } else {
      while (!caller_in.load()) std::this_thread::yield();
      others.fetch_add(1);
    }
  });
  WorkerPool::RecordJobs(nullptr);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].caller_pieces, 1);
  EXPECT_EQ(spans[0].pieces, count);
  // The worker ran out of pieces first, the caller last.
  EXPECT_GT(spans[0].workers_end_ns, 0);
  EXPECT_LE(spans[0].workers_end_ns, spans[0].caller_end_ns);
}

// When each side ran out of pieces: a worker's piece that goes on 2 ms after
// the caller's has returned ends the job 2 ms after the caller ran out, and
// the span says so (the time engine_bench's timeline reports as uneven).
TEST(WorkerPoolTest, RecordJobsTellsWhenEachSideRanOutOfPieces) {
  WorkerPool pool(2);
  std::vector<PoolJobSpan> spans;
  WorkerPool::RecordJobs(&spans);
  std::atomic<bool> worker_in{false}, caller_out{false};
  const std::thread::id caller = std::this_thread::get_id();
  pool.Run(2, [&](int, int) {
    if (std::this_thread::get_id() == caller) {
      // The caller's one piece: wait until a worker holds the other.
      while (!worker_in.load()) std::this_thread::yield();
      caller_out.store(true);
    } else {
      worker_in.store(true);
      while (!caller_out.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  WorkerPool::RecordJobs(nullptr);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].caller_pieces, 1);
  EXPECT_GE(spans[0].workers_end_ns - spans[0].caller_end_ns, 1'000'000);
  EXPECT_LE(spans[0].workers_end_ns, spans[0].end_ns);
}

}  // namespace
}  // namespace switchserve::cpu
