// Small synchronous client helpers shared by the C++ integration tests.
#ifndef SWITCHSERVE_TESTS_INTEGRATION_TEST_CLIENTS_H_
#define SWITCHSERVE_TESTS_INTEGRATION_TEST_CLIENTS_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "switchserve/v1/generation.grpc.pb.h"

namespace switchserve::testing {

// Runs `calls` calls spread over `threads` threads; `call(i, rng)` makes call
// i and returns the status its client saw (rng: the thread's own, seeded
// `seed` + the thread's index). Returns the statuses by code.
template <typename Rng, typename Call>
std::map<grpc::StatusCode, int> RunConcurrently(int threads, int calls, uint64_t seed,
                                                const Call& call) {
  std::atomic<int> next{0};
  std::mutex mu;
  std::map<grpc::StatusCode, int> seen;
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      Rng rng(static_cast<typename Rng::result_type>(seed + t));
      for (int i = next++; i < calls; i = next++) {
        const grpc::Status status = call(i, rng);
        std::lock_guard<std::mutex> lock(mu);
        ++seen[status.error_code()];
      }
    });
  }
  for (auto& thread : running) thread.join();
  return seen;
}

// A ClientContext with a deadline `seconds` from now (bounded waits).
inline std::unique_ptr<grpc::ClientContext> ContextWithDeadline(double seconds = 60) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return context;
}

inline v1::GenerateRequest TextRequest(const std::string& text, int max_new_tokens,
                                       float temperature = 0.0f) {
  v1::GenerateRequest request;
  request.set_text(text);
  request.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  request.mutable_sampling()->set_temperature(temperature);
  return request;
}

struct StreamResult {
  grpc::Status status;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<int> tokens_per_message;  // one entry per message
  v1::GenerateStreamResponse last;
};

// Reads a whole stream.
inline StreamResult ReadStream(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                               grpc::ClientContext* context) {
  StreamResult result;
  auto reader = stub.GenerateStream(context, request);
  v1::GenerateStreamResponse message;
  while (reader->Read(&message)) {
    result.text += message.text();
    result.token_ids.insert(result.token_ids.end(), message.token_ids().begin(),
                            message.token_ids().end());
    result.tokens_per_message.push_back(message.token_ids_size());
    result.last = message;
  }
  result.status = reader->Finish();
  return result;
}

inline v1::ModelInfo GetInfo(v1::Generation::Stub& stub) {
  v1::ModelInfo info;
  auto context = ContextWithDeadline(10);
  grpc::Status status = stub.GetModelInfo(context.get(), v1::GetModelInfoRequest(), &info);
  return status.ok() ? info : v1::ModelInfo();
}

// Polls GetModelInfo until the server answers that no KV block is in use and
// nothing runs or waits (10 s); the last answer in `info` when given. An
// answer with no cache at all is no answer (GetInfo's empty ModelInfo): a
// server that stopped answering is not idle.
inline bool WaitForIdleCache(v1::Generation::Stub& stub, v1::ModelInfo* info = nullptr) {
  v1::ModelInfo last;
  for (int i = 0; i < 1000; ++i) {
    last = GetInfo(stub);
    if (last.cache().total_blocks() > 0 && last.cache().used_blocks() == 0 &&
        last.cache().running_requests() == 0 && last.cache().waiting_requests() == 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (info != nullptr) *info = last;
  return last.cache().total_blocks() > 0 && last.cache().used_blocks() == 0 &&
         last.cache().running_requests() == 0 && last.cache().waiting_requests() == 0;
}

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_INTEGRATION_TEST_CLIENTS_H_
