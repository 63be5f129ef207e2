#include "server/byte_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace switchserve {

bool ByteBudget::TryTake(int64_t bytes) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - used) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

ByteReservation::ByteReservation(ByteReservation&& other) noexcept
    : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}

ByteReservation& ByteReservation::operator=(ByteReservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr && bytes_ > 0) budget_->Give(bytes_);
    budget_ = std::move(other.budget_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ByteReservation::~ByteReservation() {
  if (budget_ != nullptr && bytes_ > 0) budget_->Give(bytes_);
}

bool ByteReservation::GrowTo(int64_t bytes) {
  if (budget_ == nullptr || bytes <= bytes_) return true;
  if (!budget_->TryTake(bytes - bytes_)) return false;
  bytes_ = bytes;
  return true;
}

void ByteReservation::ShrinkTo(int64_t bytes) {
  if (budget_ == nullptr || bytes >= bytes_) return;
  budget_->Give(bytes_ - bytes);
  bytes_ = bytes;
}

std::string StreamOutputPastLimitMessage(int64_t max_stream_buffer_bytes) {
  return absl::StrCat("the stream's unread output passed ", max_stream_buffer_bytes,
                      " bytes: its client is not reading");
}

std::string OutputBudgetFullMessage(const ByteBudget& budget, bool stream) {
  return absl::StrCat("the server holds as much output waiting for clients as it may (",
                      budget.limit(), " bytes in all)",
                      stream ? ": this stream's client is not reading" : "; retry later");
}

absl::Status ResponseRefusal(int64_t bytes, const ByteBudget& budget) {
  if (bytes <= budget.limit()) {
    return absl::ResourceExhaustedError(OutputBudgetFullMessage(budget, /*stream=*/false));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the response is ", bytes, " bytes, more than the server may hold for its clients in all (",
      budget.limit(),
      " bytes, --output-buffer-bytes): ask for fewer prompts, tokens or logprobs, or stream it"));
}

}  // namespace switchserve
