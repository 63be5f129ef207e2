// The load generator's transport-independent half: closed-loop (fixed
// concurrency) or open-loop (Poisson arrivals) scheduling of requests, and the
// per-request timing (TTFT, TPOT, latency) that feeds LatencyStats. A
// LoadTransport only starts requests and reports their tokens; the gRPC and
// HTTP clients and the in-process engine are the transports, so all are
// measured by exactly the same code.
#ifndef SWITCHSERVE_BENCH_LOAD_LOAD_GENERATOR_H_
#define SWITCHSERVE_BENCH_LOAD_LOAD_GENERATOR_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "bench/load/latency_stats.h"

namespace switchserve::bench {

// What a transport reports about one request. OnTokens may be called any
// number of times, then OnDone exactly once; the calls of one request never
// overlap (they may come from any thread, also from inside the Start that
// started it: a request refused at once). After OnDone the object is gone.
class RequestProgress {
 public:
  virtual ~RequestProgress() = default;
  virtual void OnTokens(int count) = 0;
  virtual void OnDone(bool ok, const std::string& error) = 0;
};

class LoadTransport {
 public:
  virtual ~LoadTransport() = default;
  // Starts one request whose sampling seed is `seed` and returns without
  // waiting for it; its progress goes to `progress`.
  virtual void Start(uint64_t seed, RequestProgress* progress) = 0;
  // Each request's last `tokens` prompt ids (a prompt given as ids) are its
  // own, drawn from its seed: a prefix every request shares, then a part of
  // its own, as behind one system prompt. 0 (the default): every request
  // sends the same prompt.
  void set_distinct_tail_tokens(int tokens) { distinct_tail_tokens_ = tokens; }

 protected:
  // Replaces the last distinct_tail_tokens of `ids` with ids drawn from
  // `seed`, in the range of the ids before them.
  template <typename Ids>
  void VaryTail(uint64_t seed, Ids& ids) const {
    const int n = static_cast<int>(ids.size());
    const int shared = n - std::min(distinct_tail_tokens_, n);
    if (shared == n) return;
    int32_t lo = ids[0], hi = ids[0];
    for (int i = 0; i < std::max(shared, 1); ++i) {
      lo = std::min<int32_t>(lo, ids[i]);
      hi = std::max<int32_t>(hi, ids[i]);
    }
    for (int i = shared; i < n; ++i) {
      ids[i] = lo + static_cast<int32_t>(TailDraw(seed, i) % static_cast<uint64_t>(hi - lo + 1));
    }
  }

 private:
  static uint64_t TailDraw(uint64_t seed, int position);
  int distinct_tail_tokens_ = 0;
};

enum class LoadMode { kClosed, kOpen };

struct LoadOptions {
  LoadMode mode = LoadMode::kClosed;
  int concurrency = 8;     // closed loop: requests in flight
  double rate_per_s = 10;  // open loop: mean arrivals per second
  int requests = 200;      // in total
  uint64_t seed = 1;       // arrival process; request i gets seed + i
  // Sent first, closed loop at min(concurrency, warmup_requests) in flight,
  // and neither timed nor counted: the first requests also pay for
  // connecting and starting threads.
  int warmup_requests = 0;
  // Called once the warm-up is over, as the timed requests start (may be
  // empty): an in-process caller reads its engine's counters there.
  std::function<void()> on_timed_start;
};

struct LoadResult {
  double wall_s = 0;
  double cpu_s = 0;    // this process's user + system CPU during the load
  std::string report;  // LatencyStats::Report
};

// Sends options.warmup_requests, then options.requests requests through
// `transport` and waits for all; only the latter are timed.
LoadResult RunLoad(LoadTransport& transport, const LoadOptions& options);

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_LOAD_LOAD_GENERATOR_H_
