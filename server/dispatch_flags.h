// The expert dispatch flags every subcommand that runs the model shares
// (serve, generate, score): overrides of the model's `dispatch` config,
// parsed and validated once into DispatchOverrides.
#ifndef SWITCHSERVE_SERVER_DISPATCH_FLAGS_H_
#define SWITCHSERVE_SERVER_DISPATCH_FLAGS_H_

#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

ABSL_DECLARE_FLAG(std::optional<double>, capacity_factor);
ABSL_DECLARE_FLAG(std::string, overflow);
ABSL_DECLARE_FLAG(std::optional<int>, min_capacity);
ABSL_DECLARE_FLAG(std::string, capacity_scope);
ABSL_DECLARE_FLAG(std::optional<int>, capacity_group);

namespace switchserve {

// Unset: the model's value.
struct DispatchOverrides {
  std::optional<double> capacity_factor;
  std::optional<OverflowPolicy> overflow;
  std::optional<int> min_capacity;
  std::optional<CapacityScope> scope;
  std::optional<int> capacity_group;
};

// Reads the flags above (after absl::ParseCommandLine). INVALID_ARGUMENT
// names the flag.
absl::StatusOr<DispatchOverrides> DispatchOverridesFromFlags();

// The model's dispatch with the overrides applied. INVALID_ARGUMENT when a
// capacity group is given for the step scope (as in config.json, where
// capacity_group applies to the sequence scope only).
absl::StatusOr<DispatchConfig> ApplyDispatchOverrides(const DispatchConfig& model,
                                                      const DispatchOverrides& overrides);

// One line describing a dispatch for logs: "capacity_factor 2 (sequence scope,
// capacity_group 128), min_capacity 4, overflow drop".
std::string DescribeDispatch(const DispatchConfig& dispatch);

// The startup warning for a dispatch whose capacity one request shares with
// the others of its step (the step scope with a capacity limit); empty for
// every other dispatch.
std::string SharedCapacityWarning(const DispatchConfig& dispatch);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_DISPATCH_FLAGS_H_
