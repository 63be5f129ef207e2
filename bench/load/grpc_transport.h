// Load-generator transport over gRPC: every request is a GenerateStream call
// to a running `switchserve serve`, so TTFT and TPOT are what a client sees.
// The calls run on one completion queue, driven by one thread of the
// transport's own: that thread polls the connection and runs each call's next
// step itself, with no hand-over to another thread per message, so the load
// generator takes as little as it can of the cores it shares with the server.
#ifndef SWITCHSERVE_BENCH_LOAD_GRPC_TRANSPORT_H_
#define SWITCHSERVE_BENCH_LOAD_GRPC_TRANSPORT_H_

#include <memory>
#include <string>
#include <thread>

#include "bench/load/load_generator.h"
#include "grpcpp/channel.h"
#include "grpcpp/completion_queue.h"
#include "switchserve/v1/generation.grpc.pb.h"

namespace switchserve::bench {

class GrpcTransport : public LoadTransport {
 public:
  // `request` is sent as is, with sampling.seed set per request; `token`,
  // when non-empty, goes out as "authorization: Bearer <token>".
  GrpcTransport(std::shared_ptr<grpc::Channel> channel, v1::GenerateRequest request,
                std::string token, double timeout_s);
  // Every request started must have finished (RunLoad waits for them).
  ~GrpcTransport() override;
  void Start(uint64_t seed, RequestProgress* progress) override;

 private:
  class StreamCall;
  void Loop();

  std::unique_ptr<v1::Generation::Stub> stub_;
  const v1::GenerateRequest request_;
  const std::string token_;
  const double timeout_s_;
  grpc::CompletionQueue queue_;
  std::thread thread_;  // runs Loop: the queue's operations, until it shuts down
};

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_LOAD_GRPC_TRANSPORT_H_
