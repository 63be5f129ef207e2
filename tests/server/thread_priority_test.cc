// The serving threads' lower priority (server/thread_priority.h) and the
// list of compute threads it spares (engine/runtime/compute_threads.h).
#include "server/thread_priority.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <future>
#include <optional>
#include <thread>

#include "engine/runtime/compute_threads.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve {
namespace {

int NiceOf(pid_t tid) {
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  EXPECT_EQ(errno, 0) << "thread " << tid;
  return nice;
}

bool IsComputeThread(pid_t tid) {
  const std::vector<pid_t> ids = ComputeThreadIds();
  return std::find(ids.begin(), ids.end(), tid) != ids.end();
}

// A thread that reports its id, then waits until released.
class ParkedThread {
 public:
  explicit ParkedThread(bool compute)
      : thread_([this, compute] {
          std::optional<ComputeThreadScope> scope;
          if (compute) scope.emplace();
          id_.set_value(gettid());
          release_.get_future().wait();
        }),
        tid_(id_.get_future().get()) {}
  ~ParkedThread() {
    release_.set_value();
    thread_.join();
  }
  pid_t tid() const { return tid_; }

 private:
  std::promise<pid_t> id_;
  std::promise<void> release_;
  std::thread thread_;
  pid_t tid_;
};

TEST(ComputeThreadsTest, ListedWhileTheScopeLives) {
  std::promise<pid_t> id;
  std::promise<void> leave_scope, scope_left, release;
  std::thread thread([&] {
    {
      const ComputeThreadScope scope;
      id.set_value(gettid());
      leave_scope.get_future().wait();
    }
    scope_left.set_value();
    release.get_future().wait();
  });
  const pid_t tid = id.get_future().get();
  EXPECT_TRUE(IsComputeThread(tid));
  EXPECT_FALSE(IsComputeThread(gettid()));
  leave_scope.set_value();
  scope_left.get_future().wait();
  EXPECT_FALSE(IsComputeThread(tid));
  release.set_value();
  thread.join();
}

TEST(ComputeThreadsTest, AWorkerPoolsWorkersAreListedOnceItExists) {
  const size_t before = ComputeThreadIds().size();
  {
    cpu::WorkerPool pool(3);
    EXPECT_EQ(ComputeThreadIds().size(), before + 2);
  }
  EXPECT_EQ(ComputeThreadIds().size(), before);
}

TEST(ThreadPriorityTest, RejectsIncrementsOutsideOneToNineteen) {
  EXPECT_EQ(LowerServingThreadsPriority(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LowerServingThreadsPriority(20).code(), absl::StatusCode::kInvalidArgument);
}

// Every thread but the compute threads, the caller included, gets the
// increment, and so does a thread the caller starts afterwards. (The test
// process's threads stay lowered; nothing after it asks for speed.)
TEST(ThreadPriorityTest, LowersEveryThreadButTheComputeThreads) {
  const int base = NiceOf(gettid());
  ASSERT_LE(base, 14) << "the test needs room for +5 below the maximum nice value 19";
  ParkedThread compute(/*compute=*/true), serving(/*compute=*/false);
  ASSERT_EQ(NiceOf(compute.tid()), base);
  ASSERT_EQ(NiceOf(serving.tid()), base);

  ASSERT_TRUE(LowerServingThreadsPriority(5).ok());
  EXPECT_EQ(NiceOf(compute.tid()), base);
  EXPECT_EQ(NiceOf(serving.tid()), base + 5);
  EXPECT_EQ(NiceOf(gettid()), base + 5);
  std::atomic<int> later{-100};
  std::thread([&later] { later = NiceOf(gettid()); }).join();
  EXPECT_EQ(later.load(), base + 5);

  // Again: capped at 19.
  ASSERT_TRUE(LowerServingThreadsPriority(19).ok());
  EXPECT_EQ(NiceOf(serving.tid()), 19);
  EXPECT_EQ(NiceOf(compute.tid()), base);
}

}  // namespace
}  // namespace switchserve
