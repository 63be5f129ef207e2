// Grids of the SIMT executor: blocks handed to a pool of host threads (the
// calling thread included) in the configured order, a watchdog for launches
// that never finish, and the executor's configuration.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_control.h"
#include "kernels/cuda/simt_internal.h"

namespace simt::detail {
namespace {

int EnvInt(const char* name, int fallback, int min_value, int max_value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < min_value || value > max_value) {
    std::fprintf(stderr, "simt: %s=%s: expected an integer in [%d, %d]\n", name, text, min_value,
                 max_value);
    std::abort();
  }
  return static_cast<int>(value);
}

struct Config {
  int host_threads = 2;
  size_t stack_bytes = 64 << 10;
  int watchdog_s = 300;
  std::mutex mu;
  ThreadOrder order;
};
Config& TheConfig() {
  static Config* config = [] {
    auto* c = new Config;  // never destroyed
    const int hardware = static_cast<int>(std::thread::hardware_concurrency());
    c->host_threads = EnvInt("SWITCHSERVE_SIMT_THREADS", std::clamp(hardware, 2, 16), 1, 256);
#if defined(__SANITIZE_ADDRESS__)
    const int default_stack_kib = 256;
#else
    const int default_stack_kib = 64;
#endif
    c->stack_bytes =
        static_cast<size_t>(EnvInt("SWITCHSERVE_SIMT_STACK_KIB", default_stack_kib, 16, 65536))
        << 10;
    c->watchdog_s = EnvInt("SWITCHSERVE_SIMT_WATCHDOG_S", 300, 0, 1 << 20);
    if (const char* text = std::getenv("SWITCHSERVE_SIMT_ORDER"); text != nullptr && *text) {
      if (!ParseThreadOrder(text, &c->order)) {
        std::fprintf(stderr,
                     "simt: SWITCHSERVE_SIMT_ORDER=%s: expected forward, reverse or random:SEED\n",
                     text);
        std::abort();
      }
    }
    return c;
  }();
  return *config;
}

// Host threads for blocks: the caller plus up to `threads - 1` pool threads.
// The pool lives as long as the process, so each thread is detached as it
// starts. A thread the system refuses (a process thread limit) leaves the
// pool smaller, said once on stderr: launches then run on fewer threads.
class HostPool {
 public:
  explicit HostPool(int threads) {
    for (int i = 0; i + 1 < threads; ++i) {
      try {
        std::thread([this, i] { Loop(i); }).detach();
      } catch (const std::system_error& e) {
        std::fprintf(stderr, "simt: host thread %d of %d not started (%s): blocks run on %d\n",
                     i + 2, threads, e.what(), i + 1);
        break;
      }
      ++workers_;
    }
  }

  // The caller and the pool's threads.
  int threads() const { return workers_ + 1; }

  // Runs `work` on `n` (at most threads()) host threads at once; returns
  // when every one returned.
  void Run(int n, const std::function<void()>& work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_ = &work;
      wanted_ = n - 1;
      active_ = n - 1;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return active_ == 0; });
  }

 private:
  void Loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* work = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= wanted_) continue;
        work = work_;
      }
      (*work)();
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void()>* work_ = nullptr;
  uint64_t generation_ = 0;
  int wanted_ = 0;
  int active_ = 0;
  int workers_ = 0;  // threads started
};

// Aborts the process when one launch runs longer than the configured limit: a
// kernel thread spinning on memory that another thread of its block would
// change (a pattern the executor cannot run) would otherwise hang the test.
class Watchdog {
 public:
  // Where the system refuses its thread, launches run unwatched, said once
  // on stderr.
  explicit Watchdog(int limit_s) : limit_s_(limit_s) {
    try {
      std::thread([this] { Loop(); }).detach();
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "simt: watchdog thread not started (%s): launches run unwatched\n",
                   e.what());
    }
  }
  void Start(const std::string& kernel) {
    std::lock_guard<std::mutex> lock(mu_);
    kernel_ = kernel;
    start_ = std::chrono::steady_clock::now();
    running_ = true;
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }

 private:
  void Loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::lock_guard<std::mutex> lock(mu_);
      if (running_ && std::chrono::steady_clock::now() - start_ > std::chrono::seconds(limit_s_)) {
        std::fprintf(stderr,
                     "simt: kernel '%s' has run for more than %d s "
                     "(SWITCHSERVE_SIMT_WATCHDOG_S): a thread waiting for memory another thread "
                     "of its block writes, without a barrier?\n",
                     kernel_.c_str(), limit_s_);
        std::abort();
      }
    }
  }

  const int limit_s_;
  std::mutex mu_;
  std::string kernel_;
  std::chrono::steady_clock::time_point start_;
  bool running_ = false;
};

}  // namespace

int HostThreads() { return TheConfig().host_threads; }
size_t StackBytes() { return TheConfig().stack_bytes; }
ThreadOrder CurrentOrder() {
  Config& config = TheConfig();
  std::lock_guard<std::mutex> lock(config.mu);
  return config.order;
}

cudaError_t RunGrid(const KernelLaunch& launch) {
  // The watchdog first: under a thread limit, a hang caught matters more
  // than a block run in parallel.
  static Watchdog* watchdog =
      TheConfig().watchdog_s > 0 ? new Watchdog(TheConfig().watchdog_s) : nullptr;
  static HostPool* pool = new HostPool(HostThreads());
  const dim3 grid = launch.grid;
  const int64_t blocks = int64_t{grid.x} * grid.y * grid.z;
  const ThreadOrder order = CurrentOrder();
  std::vector<int64_t> shuffled;
  if (order.order == Order::kRandom) {
    shuffled.resize(blocks);
    for (int64_t b = 0; b < blocks; ++b) shuffled[b] = b;
    uint64_t state = order.seed ^ 0x6a09e667f3bcc908ull;
    for (int64_t i = blocks - 1; i > 0; --i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(shuffled[i], shuffled[static_cast<int64_t>((state >> 11) % (i + 1))]);
    }
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  cudaError_t error = cudaSuccess;
  const std::function<void()> work = [&] {
    BlockRunner& runner = ThisThreadRunner();
    while (!failed.load(std::memory_order_relaxed)) {
      const int64_t k = next.fetch_add(1);
      if (k >= blocks) break;
      const int64_t b = order.order == Order::kForward   ? k
                        : order.order == Order::kReverse ? blocks - 1 - k
                                                         : shuffled[k];
      const uint3 idx{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                      static_cast<unsigned>(b / (int64_t{grid.x} * grid.y))};
      const cudaError_t code = RunBlock(runner, launch, idx, b);
      if (code != cudaSuccess) {
        failed = true;
        std::lock_guard<std::mutex> lock(error_mu);
        if (error == cudaSuccess) error = code;
      }
    }
  };
  if (watchdog != nullptr) watchdog->Start(launch.name);
  const int threads = static_cast<int>(std::min<int64_t>(pool->threads(), blocks));
  if (threads <= 1) {
    work();
  } else {
    pool->Run(threads, work);
  }
  if (watchdog != nullptr) watchdog->Stop();
  return error;
}

}  // namespace simt::detail

namespace simt {

bool ParseThreadOrder(std::string_view text, ThreadOrder* out) {
  if (text == "forward") {
    *out = ThreadOrder{Order::kForward, 0};
    return true;
  }
  if (text == "reverse") {
    *out = ThreadOrder{Order::kReverse, 0};
    return true;
  }
  constexpr std::string_view kRandom = "random:";
  if (text.substr(0, kRandom.size()) != kRandom || text.size() == kRandom.size()) return false;
  uint64_t seed = 0;
  for (char c : text.substr(kRandom.size())) {
    if (c < '0' || c > '9') return false;
    seed = seed * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = ThreadOrder{Order::kRandom, seed};
  return true;
}

std::string ToString(const ThreadOrder& order) {
  switch (order.order) {
    case Order::kForward:
      return "forward";
    case Order::kReverse:
      return "reverse";
    case Order::kRandom:
      return absl::StrCat("random:", order.seed);
  }
  return "?";
}

void SetThreadOrder(const ThreadOrder& order) {
  detail::Config& config = detail::TheConfig();
  std::lock_guard<std::mutex> lock(config.mu);
  config.order = order;
}

ThreadOrder GetThreadOrder() { return detail::CurrentOrder(); }

}  // namespace simt
