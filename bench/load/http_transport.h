// Load-generator transport over the OpenAI-compatible HTTP API: every request
// is a streaming POST /v1/completions (server-sent events) to a running
// `switchserve serve --http-port`, on its own connection, so TTFT and TPOT
// are what an HTTP client sees. An event may carry several tokens
// (`--stream-interval`), and without logprobs it does not say how many: the
// first event's arrival is the first token's, and the stream's usage event
// (stream_options.include_usage) gives the total.
#ifndef SWITCHSERVE_BENCH_LOAD_HTTP_TRANSPORT_H_
#define SWITCHSERVE_BENCH_LOAD_HTTP_TRANSPORT_H_

#include <memory>
#include <string>

#include "bench/load/load_generator.h"
#include "switchserve/v1/generation.pb.h"

namespace switchserve::bench {

class HttpTransport : public LoadTransport {
 public:
  // `request`'s prompt and sampling become the completion request's fields
  // (the seed is set per request); `token`, when non-empty, goes out as
  // "Authorization: Bearer <token>". `host` is an IP address.
  HttpTransport(std::string host, int port, const v1::GenerateRequest& request, std::string token,
                double timeout_s);
  ~HttpTransport() override;
  void Start(uint64_t seed, RequestProgress* progress) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_LOAD_HTTP_TRANSPORT_H_
