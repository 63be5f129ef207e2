// Load-generator transport without a server: requests go straight into an
// in-process GenerationEngine (the scheduler, backend and sampler that
// `switchserve serve` runs, set up by server/engine_setup.h) and tokens come
// back through its GenerationSink. Compared with GrpcTransport on the same
// load, the difference is the cost of serving (gRPC, protobuf, threads). A
// request fails where its gRPC call would: an engine error, a refusal, and a
// request the engine cancelled (at its deadline: DEADLINE_EXCEEDED), each
// with the status code and message a gRPC client reports.
#ifndef SWITCHSERVE_BENCH_LOAD_ENGINE_TRANSPORT_H_
#define SWITCHSERVE_BENCH_LOAD_ENGINE_TRANSPORT_H_

#include <chrono>

#include "bench/load/load_generator.h"
#include "engine/runtime/generation_engine.h"
#include "engine/runtime/request.h"

namespace switchserve::bench {

class EngineTransport : public LoadTransport {
 public:
  // `request` is the template of every request (validated, without sink);
  // each gets its own seed, arrival time and deadline. `engine` (started)
  // must outlive the transport.
  EngineTransport(GenerationEngine* engine, GenerationRequest request, double timeout_s);
  void Start(uint64_t seed, RequestProgress* progress) override;

 private:
  GenerationEngine* const engine_;
  const GenerationRequest request_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_LOAD_ENGINE_TRANSPORT_H_
