#include "bench/load/load_generator.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

namespace switchserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double MillisBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// User + system CPU seconds of this process so far, all threads.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Counts finished requests; Wait blocks until `total` have finished. Only
// the last one wakes the waiting thread: a wake-up per request would cost
// the load generator a futex call and a thread switch on the cores it
// shares with the server.
class Completion {
 public:
  explicit Completion(int total) : total_(total) {}
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (++done_ == total_) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= total_; });
  }

 private:
  const int total_;
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
};

// Times one request from the moment it is handed to the transport; records
// its sample, starts its successor (closed loop) and deletes itself when done.
class TimedRequest : public RequestProgress {
 public:
  TimedRequest(LatencyStats* stats, Completion* completion, std::function<void()> next)
      : stats_(stats), completion_(completion), next_(std::move(next)), sent_(Clock::now()) {}

  void OnTokens(int count) override {
    if (count <= 0) return;
    if (tokens_ == 0) first_token_ = Clock::now();
    tokens_ += count;
  }

  void OnDone(bool ok, const std::string& error) override {
    const Clock::time_point end = Clock::now();
    RequestSample sample;
    sample.ok = ok;
    sample.error = ok ? "" : error;
    sample.tokens = tokens_;
    sample.latency_ms = MillisBetween(sent_, end);
    sample.ttft_ms = tokens_ > 0 ? MillisBetween(sent_, first_token_) : sample.latency_ms;
    sample.tpot_ms = tokens_ > 1 ? MillisBetween(first_token_, end) / (tokens_ - 1) : 0;
    stats_->Add(sample);
    // Start the successor before counting this one done: once the last one is
    // counted, RunLoad returns and what `next` refers to is gone.
    Completion* completion = completion_;
    std::function<void()> next = std::move(next_);
    delete this;
    if (next) next();
    completion->Done();
  }

 private:
  LatencyStats* const stats_;
  Completion* const completion_;
  std::function<void()> next_;
  const Clock::time_point sent_;
  Clock::time_point first_token_;
  int tokens_ = 0;
};

// Runs `start` now, unless this thread is already inside a call of this
// function further up its stack: then that call runs it once `start`'s
// predecessor has returned. A transport may finish a request inside Start
// (the engine refuses it at once), and OnDone starts the next request of a
// closed loop: without this, every such refusal would nest one Start deeper,
// until the stack ran out.
void StartUnnested(std::function<void()> start) {
  thread_local std::deque<std::function<void()>>* pending = nullptr;
  if (pending != nullptr) {
    pending->push_back(std::move(start));
    return;
  }
  std::deque<std::function<void()>> queue;
  queue.push_back(std::move(start));
  pending = &queue;
  while (!queue.empty()) {
    const std::function<void()> next = std::move(queue.front());
    queue.pop_front();
    next();
  }
  pending = nullptr;
}

}  // namespace

uint64_t LoadTransport::TailDraw(uint64_t seed, int position) {
  // SplitMix64's finalizer over the seed and the position.
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(position) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

LoadResult RunLoad(LoadTransport& transport, const LoadOptions& options) {
  if (options.warmup_requests > 0) {
    // A closed-loop load of its own, whose figures are dropped; its seeds
    // follow the timed requests', so those keep theirs.
    LoadOptions warmup = options;
    warmup.mode = LoadMode::kClosed;
    warmup.requests = options.warmup_requests;
    warmup.seed = options.seed + options.requests;
    warmup.warmup_requests = 0;
    warmup.on_timed_start = nullptr;
    RunLoad(transport, warmup);
  }
  LatencyStats stats;
  const int total = options.requests;
  Completion completion(total);
  if (options.on_timed_start) options.on_timed_start();
  const Clock::time_point start = Clock::now();
  const double cpu_start = ProcessCpuSeconds();
  std::atomic<int> launched{0};
  // Closed loop: each finished request starts the next until `total` were
  // sent. (Lives until every request is done: the requests refer to it.) The
  // index is taken first: until request `index` is done, RunLoad waits, so
  // what the deferred start refers to is still there when it runs.
  std::function<void()> launch = [&] {
    const int index = launched.fetch_add(1);
    if (index >= total) return;
    StartUnnested([&, index] {
      transport.Start(options.seed + index, new TimedRequest(&stats, &completion, launch));
    });
  };
  if (options.mode == LoadMode::kClosed) {
    const int initial = std::min(total, options.concurrency);
    for (int i = 0; i < initial; ++i) launch();
  } else {
    std::mt19937_64 generator(options.seed);
    std::exponential_distribution<double> gap_s(options.rate_per_s);
    Clock::time_point next = start;
    for (int i = 0; i < total; ++i) {
      std::this_thread::sleep_until(next);
      transport.Start(options.seed + i, new TimedRequest(&stats, &completion, nullptr));
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(gap_s(generator)));
    }
  }
  completion.Wait();
  LoadResult result;
  result.wall_s = MillisBetween(start, Clock::now()) / 1000.0;
  result.cpu_s = ProcessCpuSeconds() - cpu_start;
  result.report = stats.Report(result.wall_s, result.cpu_s);
  return result;
}

}  // namespace switchserve::bench
