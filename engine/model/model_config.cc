#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace switchserve {

int AttentionConfig::RotaryDims() const {
  if (position == PositionKind::kXl) return 0;
  int dims = static_cast<int>(std::floor(rotate_fraction * head_dim));
  return dims - dims % 2;
}

int64_t DispatchConfig::CapacityPerExpert(int64_t tokens, int k, int experts) const {
  const double slots = std::ceil(capacity_factor * static_cast<double>(tokens) * k / experts);
  // A factor so large that the slots leave int64 (or a NaN) means room for
  // everything: saturate rather than convert out of range.
  if (!(slots < static_cast<double>(kMaxCapacity))) return kMaxCapacity;
  return std::max<int64_t>(min_capacity, static_cast<int64_t>(slots));
}

std::string_view ToString(OverflowPolicy policy) {
  switch (policy) {
    case OverflowPolicy::kDrop:
      return "drop";
    case OverflowPolicy::kReroute:
      return "reroute";
  }
  return "?";
}

absl::StatusOr<OverflowPolicy> ParseOverflowPolicy(std::string_view text) {
  if (text == "drop") return OverflowPolicy::kDrop;
  if (text == "reroute") return OverflowPolicy::kReroute;
  return absl::InvalidArgumentError(absl::StrCat(
      "overflow policy: expected \"drop\" or \"reroute\", found \"", std::string(text), "\""));
}

std::string_view ToString(CapacityScope scope) {
  switch (scope) {
    case CapacityScope::kSequence:
      return "sequence";
    case CapacityScope::kStep:
      return "step";
  }
  return "?";
}

absl::StatusOr<CapacityScope> ParseCapacityScope(std::string_view text) {
  if (text == "sequence") return CapacityScope::kSequence;
  if (text == "step") return CapacityScope::kStep;
  return absl::InvalidArgumentError(absl::StrCat(
      "capacity scope: expected \"sequence\" or \"step\", found \"", std::string(text), "\""));
}

}  // namespace switchserve
