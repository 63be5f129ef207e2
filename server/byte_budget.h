// Bytes that many holders share under one limit: the HTTP request bodies
// being read (--http-body-buffer-bytes), and the streamed output waiting for
// clients that do not read it (--output-buffer-bytes). A holder takes
// its share through a ByteReservation, given back when the reservation is
// destroyed, so that a holder that goes away never leaves bytes taken.
#ifndef SWITCHSERVE_SERVER_BYTE_BUDGET_H_
#define SWITCHSERVE_SERVER_BYTE_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace switchserve {

// A limit and what is taken of it. Thread-safe and lock-free: a stream
// takes and gives back on every message, on the engine thread among others.
class ByteBudget {
 public:
  explicit ByteBudget(int64_t limit_bytes) : limit_(limit_bytes) {}
  int64_t limit() const { return limit_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Takes `bytes` if they fit beside what is taken; false (taking nothing)
  // if not.
  bool TryTake(int64_t bytes);
  void Give(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

// What one holder takes of a ByteBudget, given back when the reservation is
// destroyed. A reservation without a budget takes nothing and refuses
// nothing. Move-only; not thread-safe (its holder's to guard).
class ByteReservation {
 public:
  ByteReservation() = default;
  explicit ByteReservation(std::shared_ptr<ByteBudget> budget) : budget_(std::move(budget)) {}
  ByteReservation(ByteReservation&& other) noexcept;
  ByteReservation& operator=(ByteReservation&& other) noexcept;
  ByteReservation(const ByteReservation&) = delete;
  ByteReservation& operator=(const ByteReservation&) = delete;
  ~ByteReservation();

  // Holds at least `bytes` from now on (it never shrinks here). False,
  // holding what it held, when the budget has no room for the difference.
  bool GrowTo(int64_t bytes);
  // Holds at most `bytes` from now on, giving back the rest.
  void ShrinkTo(int64_t bytes);
  int64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<ByteBudget> budget_;
  int64_t bytes_ = 0;
};

// Why a stream (gRPC GenerateStream, an HTTP streamed completion) was ended
// with its client not reading: its own unread output passed
// `max_stream_buffer_bytes` (--max-stream-buffer-bytes), or did not fit in
// `budget`, the output waiting for all clients together
// (--output-buffer-bytes); or, `stream` false, why a unary response that
// did not fit there was refused.
std::string StreamOutputPastLimitMessage(int64_t max_stream_buffer_bytes);
std::string OutputBudgetFullMessage(const ByteBudget& budget, bool stream = true);
// The refusal of a unary response of `bytes` that `budget` did not hold:
// INVALID_ARGUMENT when it is larger than the whole budget (it never would
// fit: not a RESOURCE_EXHAUSTED that clients retry, generating it again each
// time), else RESOURCE_EXHAUSTED (the output held for other clients leaves
// no room).
absl::Status ResponseRefusal(int64_t bytes, const ByteBudget& budget);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_BYTE_BUDGET_H_
