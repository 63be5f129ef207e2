// The server's drain state, shared by its front ends (gRPC and HTTP): whether
// new generation calls are still admitted, and how many are running. On
// SIGTERM the server closes the gate (new calls get UNAVAILABLE / 503) and
// waits until the running calls of both protocols have finished.
//
// Thread-safe.
#ifndef SWITCHSERVE_SERVER_CALL_GATE_H_
#define SWITCHSERVE_SERVER_CALL_GATE_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace switchserve {

class CallGate {
 public:
  // From now on draining() is true; calls already running go on. The quiet
  // period (WaitUntilQuiet) counts from now at the earliest: a server idle
  // when told to stop still refuses (UNAVAILABLE) the calls of the next
  // moment rather than closing at once on them (CANCELLED).
  void StartDraining() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    last_started_ = std::max(last_started_, std::chrono::steady_clock::now());
  }
  bool draining() const {
    std::lock_guard<std::mutex> lock(mu_);
    return draining_;
  }
  // The drain's timeout has passed: the calls still running are being ended
  // by the server (their clients see UNAVAILABLE or a cancel). A call gRPC
  // cancels from now on was ended by the server, not by its client.
  void EndRunningCalls() {
    std::lock_guard<std::mutex> lock(mu_);
    ending_running_calls_ = true;
  }
  bool ending_running_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ending_running_calls_;
  }

  // A call started / ended; every CallStarted is followed by one CallDone.
  void CallStarted() {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
    last_started_ = std::chrono::steady_clock::now();
  }
  void CallDone() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--in_flight_ == 0) idle_.notify_all();
  }
  int calls_in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }

  // Blocks until no call is running, or `timeout` passed. True when idle.
  bool WaitUntilIdle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return idle_.wait_for(lock, timeout, [&] { return in_flight_ == 0; });
  }

  // Blocks until no call is running and none has started for `quiet`, or
  // `timeout` passed. True when quiet. A draining server waits for this
  // before it stops listening: a call that reaches gRPC after the listener
  // closed is cancelled by gRPC itself, and its client sees CANCELLED, which
  // unlike the gate's UNAVAILABLE does not tell it to retry elsewhere.
  bool WaitUntilQuiet(std::chrono::milliseconds quiet, std::chrono::milliseconds timeout) {
    const auto give_up = std::chrono::steady_clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      const auto now = std::chrono::steady_clock::now();
      const auto quiet_at = last_started_ + quiet;
      if (in_flight_ == 0 && now >= quiet_at) return true;
      if (now >= give_up) return false;
      // Running calls: the last one's CallDone wakes us. Otherwise wake when
      // the quiet period would end (a call started meanwhile moves it on).
      idle_.wait_until(lock, in_flight_ > 0 ? give_up : std::min(give_up, quiet_at));
    }
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable idle_;
  bool draining_ = false;
  bool ending_running_calls_ = false;
  int in_flight_ = 0;
  std::chrono::steady_clock::time_point last_started_{};
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_CALL_GATE_H_
