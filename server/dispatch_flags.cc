#include "server/dispatch_flags.h"

#include <cmath>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

ABSL_FLAG(std::optional<double>, capacity_factor, std::nullopt,
          "Expert capacity factor; <= 0 dropless; unset: the model's");
ABSL_FLAG(std::string, overflow, "", "drop | reroute; unset: the model's");
ABSL_FLAG(std::optional<int>, min_capacity, std::nullopt,
          "Minimum slots per expert per capacity group (or step); unset: the model's");
ABSL_FLAG(std::string, capacity_scope, "",
          "sequence | step: what shares an expert's capacity, each sequence's groups of "
          "--capacity-group positions (isolated) or the whole engine step (requests affect each "
          "other); unset: the model's");
ABSL_FLAG(std::optional<int>, capacity_group, std::nullopt,
          "Positions per capacity group of a sequence (sequence scope); unset: the model's");

namespace switchserve {
namespace {

absl::Status FlagError(const char* flag, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

}  // namespace

absl::StatusOr<DispatchOverrides> DispatchOverridesFromFlags() {
  DispatchOverrides o;
  o.capacity_factor = absl::GetFlag(FLAGS_capacity_factor);
  o.min_capacity = absl::GetFlag(FLAGS_min_capacity);
  o.capacity_group = absl::GetFlag(FLAGS_capacity_group);
  if (const std::string overflow = absl::GetFlag(FLAGS_overflow); !overflow.empty()) {
    auto policy = ParseOverflowPolicy(overflow);
    if (!policy.ok()) return FlagError("overflow", std::string(policy.status().message()));
    o.overflow = *policy;
  }
  if (const std::string scope = absl::GetFlag(FLAGS_capacity_scope); !scope.empty()) {
    auto parsed = ParseCapacityScope(scope);
    if (!parsed.ok()) return FlagError("capacity-scope", std::string(parsed.status().message()));
    o.scope = *parsed;
  }
  if (o.capacity_factor && !std::isfinite(*o.capacity_factor)) {
    return FlagError("capacity-factor", "must be a finite number (<= 0: dropless)");
  }
  if (o.min_capacity && *o.min_capacity < 0) return FlagError("min-capacity", "must be >= 0");
  if (o.capacity_group && *o.capacity_group < 1) return FlagError("capacity-group", "must be >= 1");
  if (o.capacity_group && o.scope == CapacityScope::kStep) {
    return FlagError("capacity-group", "applies to --capacity-scope sequence only");
  }
  return o;
}

absl::StatusOr<DispatchConfig> ApplyDispatchOverrides(const DispatchConfig& model,
                                                      const DispatchOverrides& overrides) {
  DispatchConfig dispatch = model;
  if (overrides.capacity_factor) dispatch.capacity_factor = *overrides.capacity_factor;
  if (overrides.min_capacity) dispatch.min_capacity = *overrides.min_capacity;
  if (overrides.overflow) dispatch.overflow = *overrides.overflow;
  if (overrides.scope) dispatch.scope = *overrides.scope;
  if (overrides.capacity_group) {
    if (dispatch.scope == CapacityScope::kStep) {
      return FlagError("capacity-group",
                       "applies to the sequence capacity scope only; the model's is \"step\" "
                       "(add --capacity-scope sequence)");
    }
    dispatch.capacity_group = *overrides.capacity_group;
  }
  return dispatch;
}

std::string DescribeDispatch(const DispatchConfig& dispatch) {
  const std::string scope =
      dispatch.scope == CapacityScope::kSequence
          ? absl::StrCat("sequence scope, capacity_group ", dispatch.capacity_group)
          : std::string("step scope");
  return absl::StrFormat("capacity_factor %g (%s%s), min_capacity %d, overflow %s",
                         dispatch.capacity_factor, dispatch.Dropless() ? "dropless, " : "", scope,
                         dispatch.min_capacity, std::string(ToString(dispatch.overflow)));
}

std::string SharedCapacityWarning(const DispatchConfig& dispatch) {
  if (dispatch.scope != CapacityScope::kStep || dispatch.Dropless()) return "";
  return "capacity_scope \"step\": the requests of an engine step share every expert's "
         "capacity, so a request's output depends on what else is in the step, and a client can "
         "crowd experts to change other requests' outputs or deny them experts (Hayes et al. "
         "2024, \"Buffer Overflow in Mixture of Experts\", arXiv:2402.05526). Use "
         "--capacity-scope sequence (the default) to isolate requests.";
}

}  // namespace switchserve
