// The Generation API against the real server process: unary and streaming
// generation, tokenize, model info, health, reflection, batch invariance and
// every kind of bad input.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"

namespace switchserve::testing {
namespace {

class GenerationApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Steps of at least 5 ms: a crowd of requests stays in the batch long
    // enough for GetModelInfo to see it (GreedyOutputSameAloneAndAmong32Concurrent).
    auto started = ServerProcess::Start({"--debug-step-delay-ms", "5"});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
    stub_ = v1::Generation::NewStub(server_->Channel()).release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete server_;
  }

  // A request that must succeed: the server still answers after bad input.
  static void ExpectGoodRequestWorks() {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline();
    grpc::Status status = stub_->Generate(context.get(), TextRequest("still alive?", 5), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.token_ids_size(), 5);
  }

  static ServerProcess* server_;
  static v1::Generation::Stub* stub_;
};
ServerProcess* GenerationApiTest::server_ = nullptr;
v1::Generation::Stub* GenerationApiTest::stub_ = nullptr;

// The stream's text and token ids are the unary answer's.
void ExpectStreamIsUnary(const StreamResult& stream, const v1::GenerateResponse& unary) {
  EXPECT_EQ(stream.text, unary.text());
  EXPECT_EQ(stream.token_ids,
            std::vector<int32_t>(unary.token_ids().begin(), unary.token_ids().end()));
}

TEST_F(GenerationApiTest, UnaryAndStreamingAgree) {
  v1::GenerateRequest request = TextRequest("The experts say", 30, 0.9f);
  request.mutable_sampling()->set_seed(1234);
  request.mutable_sampling()->set_top_k(50);
  request.mutable_sampling()->set_top_p(0.95f);
  request.set_logprobs(3);
  request.set_return_routing(true);

  v1::GenerateResponse unary;
  auto context = ContextWithDeadline();
  ASSERT_TRUE(stub_->Generate(context.get(), request, &unary).ok());
  EXPECT_EQ(unary.usage().prompt_tokens(), 15);
  EXPECT_EQ(unary.usage().completion_tokens(), unary.token_ids_size());
  EXPECT_GT(unary.token_ids_size(), 0);
  EXPECT_NE(unary.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  ASSERT_EQ(unary.tokens_size(), unary.token_ids_size());
  EXPECT_EQ(unary.tokens(0).top_logprobs_size(), 3);
  EXPECT_GT(unary.tokens(0).routing().routers_size(), 0);
  EXPECT_GE(unary.timing().total_ms(), unary.timing().time_to_first_token_ms());

  auto stream_context = ContextWithDeadline();
  StreamResult stream = ReadStream(*stub_, request, stream_context.get());
  ASSERT_TRUE(stream.status.ok()) << stream.status.error_message();
  ExpectStreamIsUnary(stream, unary);
  EXPECT_TRUE(stream.last.finished());
  EXPECT_EQ(stream.last.finish_reason(), unary.finish_reason());
  EXPECT_EQ(stream.last.usage().completion_tokens(), unary.usage().completion_tokens());
}

TEST(StreamIntervalTest, StreamSendsTheFirstTokenAloneThenGroupsAndAgreesWithUnary) {
  auto server = ServerProcess::Start({"--stream-interval", "4", "--debug-step-delay-ms", "5"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Generation::NewStub((*server)->Channel());
  v1::GenerateRequest request = TextRequest("The experts say", 30, 0.9f);
  request.mutable_sampling()->set_seed(99);
  request.mutable_sampling()->set_ignore_eos(true);
  request.set_logprobs(2);

  v1::GenerateResponse unary;
  auto context = ContextWithDeadline();
  ASSERT_TRUE(stub->Generate(context.get(), request, &unary).ok());
  ASSERT_EQ(unary.token_ids_size(), 30);

  auto stream_context = ContextWithDeadline();
  StreamResult stream = ReadStream(*stub, request, stream_context.get());
  ASSERT_TRUE(stream.status.ok()) << stream.status.error_message();
  ExpectStreamIsUnary(stream, unary);
  EXPECT_EQ(stream.last.usage().completion_tokens(), 30);
  // The engine hands the call 1 token, then 4 at a time (7 groups), then the
  // last with the end; a message carries one or more whole groups (groups
  // that came while the previous message was being written are merged), so
  // every message ends where a group does.
  const std::set<int> group_ends = {1, 5, 9, 13, 17, 21, 25, 29, 30};
  int sent = 0;
  for (int tokens : stream.tokens_per_message) {
    sent += tokens;
    EXPECT_TRUE(group_ends.contains(sent))
        << sent << " in " << ::testing::PrintToString(stream.tokens_per_message);
  }
  EXPECT_EQ(sent, 30);
}

TEST_F(GenerationApiTest, TokenizeAndModelInfo) {
  v1::TokenizeRequest request;
  request.set_text("h\xC3\xA9!");
  v1::TokenizeResponse response;
  auto context = ContextWithDeadline();
  ASSERT_TRUE(stub_->Tokenize(context.get(), request, &response).ok());
  EXPECT_EQ(std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()),
            (std::vector<int32_t>{104, 0xC3, 0xA9, 33}));

  const v1::ModelInfo info = GetInfo(*stub_);
  EXPECT_EQ(info.vocab_size(), 256);
  EXPECT_EQ(info.context_length(), 64);
  EXPECT_EQ(info.tokenizer(), "byte");
  EXPECT_EQ(info.device(), "cpu");
  EXPECT_GT(info.cache().total_blocks(), 0);
  EXPECT_EQ(info.cache().block_size(), 16);
}

TEST_F(GenerationApiTest, HealthServingAndReflectionListsService) {
  auto health = grpc::health::v1::Health::NewStub(server_->Channel());
  for (const char* service : {"", "switchserve.v1.Generation"}) {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    auto context = ContextWithDeadline(10);
    ASSERT_TRUE(health->Check(context.get(), request, &response).ok());
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }

  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(server_->Channel());
  auto context = ContextWithDeadline(10);
  auto stream = reflection->ServerReflectionInfo(context.get());
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.push_back(service.name());
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "switchserve.v1.Generation"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
  while (stream->Read(&response)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(GenerationApiTest, GreedyOutputSameAloneAndAmong32Concurrent) {
  constexpr int kRequests = 32;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(TextRequest(absl::StrCat("request ", i * 37, ":"), 24));
    requests.back().mutable_sampling()->set_ignore_eos(true);
  }
  std::vector<std::string> alone(kRequests), together(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline();
    ASSERT_TRUE(stub_->Generate(context.get(), requests[i], &response).ok());
    alone[i] = response.text();
  }
  // While they run, the engine's snapshot shows how many requests share the
  // running batch (every running request gets a token in each step).
  std::atomic<bool> done{false};
  std::atomic<int> most_running{0};
  std::thread watcher([&] {
    while (!done.load()) {
      most_running = std::max(most_running.load(), GetInfo(*stub_).cache().running_requests());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> threads;
  std::vector<grpc::Status> statuses(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateResponse response;
      auto context = ContextWithDeadline();
      statuses[i] = stub_->Generate(context.get(), requests[i], &response);
      together[i] = response.text();
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  watcher.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    EXPECT_EQ(together[i], alone[i]) << "request " << i;
  }
  EXPECT_GE(most_running.load(), 2) << "the concurrent requests never shared the batch";
}

struct BadInput {
  const char* name;
  std::function<void(v1::GenerateRequest*)> mutate;
  grpc::StatusCode code;
  const char* message_part;  // the field (or limit) the message must name
};

TEST_F(GenerationApiTest, BadInputIsRejectedAndServerKeepsServing) {
  const std::vector<BadInput> cases = {
      {"empty text", [](auto* r) { r->set_text(""); }, grpc::INVALID_ARGUMENT, "text"},
      {"no prompt", [](auto* r) { r->clear_prompt(); }, grpc::INVALID_ARGUMENT, "prompt"},
      {"empty ids", [](auto* r) { r->mutable_token_ids(); }, grpc::INVALID_ARGUMENT, "token_ids"},
      {"id too large", [](auto* r) { r->mutable_token_ids()->add_ids(256); },
       grpc::INVALID_ARGUMENT, "token_ids"},
      {"negative id", [](auto* r) { r->mutable_token_ids()->add_ids(-1); }, grpc::INVALID_ARGUMENT,
       "token_ids"},
      {"prompt longer than context", [](auto* r) { r->set_text(std::string(80, 'a')); },
       grpc::INVALID_ARGUMENT, "context length is 64"},
      {"invalid UTF-8", [](auto* r) { r->set_text("ab\xFF\xFE"); }, grpc::INVALID_ARGUMENT, "text"},
      {"negative temperature", [](auto* r) { r->mutable_sampling()->set_temperature(-0.5f); },
       grpc::INVALID_ARGUMENT, "sampling.temperature"},
      {"top_p zero", [](auto* r) { r->mutable_sampling()->set_top_p(0.0f); },
       grpc::INVALID_ARGUMENT, "sampling.top_p"},
      {"top_p above one", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); },
       grpc::INVALID_ARGUMENT, "sampling.top_p"},
      {"negative top_k", [](auto* r) { r->mutable_sampling()->set_top_k(-1); },
       grpc::INVALID_ARGUMENT, "sampling.top_k"},
      {"min_p above one", [](auto* r) { r->mutable_sampling()->set_min_p(2.0f); },
       grpc::INVALID_ARGUMENT, "sampling.min_p"},
      {"zero repetition penalty",
       [](auto* r) { r->mutable_sampling()->set_repetition_penalty(0.0f); }, grpc::INVALID_ARGUMENT,
       "sampling.repetition_penalty"},
      {"presence penalty past 2",
       [](auto* r) { r->mutable_sampling()->set_presence_penalty(2.5f); }, grpc::INVALID_ARGUMENT,
       "sampling.presence_penalty: must be in [-2, 2], found 2.5"},
      {"logit bias outside vocabulary",
       [](auto* r) { (*r->mutable_sampling()->mutable_logit_bias())[300] = 1.0f; },
       grpc::INVALID_ARGUMENT, "sampling.logit_bias: id 300 is outside the vocabulary"},
      {"max_new_tokens zero", [](auto* r) { r->mutable_sampling()->set_max_new_tokens(0); },
       grpc::INVALID_ARGUMENT, "sampling.max_new_tokens"},
      {"max_new_tokens over context",
       [](auto* r) { r->mutable_sampling()->set_max_new_tokens(1000); }, grpc::INVALID_ARGUMENT,
       "sampling.max_new_tokens"},
      {"too many stop strings",
       [](auto* r) {
         for (int i = 0; i < 17; ++i) r->mutable_sampling()->add_stop(absl::StrCat("s", i));
       },
       grpc::INVALID_ARGUMENT, "sampling.stop"},
      {"empty stop string", [](auto* r) { r->mutable_sampling()->add_stop(""); },
       grpc::INVALID_ARGUMENT, "sampling.stop"},
      {"stop id outside vocabulary",
       [](auto* r) { r->mutable_sampling()->add_stop_token_ids(999); }, grpc::INVALID_ARGUMENT,
       "sampling.stop_token_ids"},
      {"too many logprobs", [](auto* r) { r->set_logprobs(21); }, grpc::INVALID_ARGUMENT,
       "logprobs"},
  };
  for (const BadInput& bad : cases) {
    SCOPED_TRACE(bad.name);
    v1::GenerateRequest request = TextRequest("hello", 8);
    bad.mutate(&request);
    for (bool streaming : {false, true}) {
      grpc::Status status;
      auto context = ContextWithDeadline();
      if (streaming) {
        status = ReadStream(*stub_, request, context.get()).status;
      } else {
        v1::GenerateResponse response;
        status = stub_->Generate(context.get(), request, &response);
      }
      EXPECT_EQ(status.error_code(), bad.code) << status.error_message();
      EXPECT_NE(status.error_message().find(bad.message_part), std::string::npos)
          << status.error_message();
      ExpectGoodRequestWorks();
    }
  }
}

}  // namespace
}  // namespace switchserve::testing
