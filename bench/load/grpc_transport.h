// Load-generator transport over gRPC: every request is a GenerateStream call
// (callback API) to a running `switchserve serve`, so TTFT and TPOT are what a
// client sees.
#ifndef SWITCHSERVE_BENCH_LOAD_GRPC_TRANSPORT_H_
#define SWITCHSERVE_BENCH_LOAD_GRPC_TRANSPORT_H_

#include <memory>
#include <string>

#include "bench/load/load_generator.h"
#include "grpcpp/channel.h"
#include "switchserve/v1/generation.grpc.pb.h"

namespace switchserve::bench {

class GrpcTransport : public LoadTransport {
 public:
  // `request` is sent as is, with sampling.seed set per request; `token`,
  // when non-empty, goes out as "authorization: Bearer <token>".
  GrpcTransport(std::shared_ptr<grpc::Channel> channel, v1::GenerateRequest request,
                std::string token, double timeout_s);
  void Start(uint64_t seed, RequestProgress* progress) override;

 private:
  std::unique_ptr<v1::Generation::Stub> stub_;
  const v1::GenerateRequest request_;
  const std::string token_;
  const double timeout_s_;
};

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_LOAD_GRPC_TRANSPORT_H_
