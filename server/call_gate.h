// The server's drain state, shared by its front ends (gRPC and HTTP): whether
// new generation calls are still admitted, and how many are running. On
// SIGTERM the server closes the gate (new calls get UNAVAILABLE / 503) and
// waits until the running calls of both protocols have finished.
//
// Thread-safe.
#ifndef SWITCHSERVE_SERVER_CALL_GATE_H_
#define SWITCHSERVE_SERVER_CALL_GATE_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace switchserve {

class CallGate {
 public:
  // From now on draining() is true; calls already running go on.
  void StartDraining() {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  bool draining() const {
    std::lock_guard<std::mutex> lock(mu_);
    return draining_;
  }

  // A call started / ended; every CallStarted is followed by one CallDone.
  void CallStarted() {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
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

 private:
  mutable std::mutex mu_;
  std::condition_variable idle_;
  bool draining_ = false;
  int in_flight_ = 0;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_CALL_GATE_H_
