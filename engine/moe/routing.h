// What routing decided for one token: the fate of each of its routed
// assignments. Backends record it (StepOutput), the engine returns it with a
// generated token (GeneratedTokenInfo) and the API reports it per router.
#ifndef SWITCHSERVE_ENGINE_MOE_ROUTING_H_
#define SWITCHSERVE_ENGINE_MOE_ROUTING_H_

#include <cstdint>
#include <vector>

namespace switchserve {

// What happened to one routed assignment of one token.
enum class RouteFate : uint8_t { kKept, kRerouted, kDropped };

struct RouteChoice {
  int32_t expert = 0;  // the expert that processed it (the new one if rerouted)
  float gate = 0;      // weight applied (dropped: the weight it would have had)
  RouteFate fate = RouteFate::kKept;
};

// Routing of one token: for every router of the model's RouterLayout, in
// layout order, its top_k choices in rank order, concatenated
// (RouterLayout::ChoiceOffset says where each router's start).
struct TokenRouting {
  std::vector<RouteChoice> choices;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MOE_ROUTING_H_
