// Many concurrent streams, cancellation mid-stream (KV blocks return to zero),
// the queue limit and the message size limit, against the real server.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_clients.h"

namespace switchserve::testing {
namespace {

TEST(LoadTest, SixtyFourStreamsFinishThenHalfCancelledFreeTheirBlocks) {
  auto server = ServerProcess::Start({"--debug-step-delay-ms", "2"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  auto stub = v1::Generation::NewStub(channel);
  constexpr int kClients = 64;

  // 1. 64 concurrent streams run to completion.
  std::vector<StreamResult> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request = TextRequest("stream " + std::to_string(i), 40, 0.7f);
      request.mutable_sampling()->set_seed(i);
      request.mutable_sampling()->set_ignore_eos(true);
      auto context = ContextWithDeadline(120);
      results[i] = ReadStream(*stub, request, context.get());
    });
  }
  for (auto& thread : threads) thread.join();
  threads.clear();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].token_ids.size(), 40u);
    EXPECT_EQ(results[i].last.finish_reason(), v1::FINISH_REASON_LENGTH);
  }

  // 2. 64 more; 32 are cancelled by their client after a few messages.
  std::atomic<int> cancelled_ok{0}, finished_ok{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request = TextRequest("again " + std::to_string(i), 50, 0.7f);
      request.mutable_sampling()->set_ignore_eos(true);
      auto context = ContextWithDeadline(120);
      auto reader = stub->GenerateStream(context.get(), request);
      v1::GenerateStreamResponse message;
      int messages = 0;
      bool cancel = i % 2 == 0;
      while (reader->Read(&message)) {
        if (cancel && ++messages == 3) context->TryCancel();
      }
      grpc::Status status = reader->Finish();
      if (cancel && status.error_code() == grpc::StatusCode::CANCELLED) ++cancelled_ok;
      if (!cancel && status.ok() && message.finished()) ++finished_ok;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(cancelled_ok.load(), kClients / 2);
  EXPECT_EQ(finished_ok.load(), kClients / 2);

  v1::ModelInfo info;
  EXPECT_TRUE(WaitForIdleCache(*stub, &info)) << info.DebugString();
}

TEST(LimitsTest, FullQueueAndOversizedMessage) {
  auto server =
      ServerProcess::Start({"--max-running-requests", "1", "--max-queue", "1",
                            "--debug-step-delay-ms", "100", "--max-request-bytes", "2048"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Generation::NewStub((*server)->Channel());

  // A runs (the only batch slot), B waits (the only queue slot), C is refused.
  auto context_a = ContextWithDeadline(60);
  v1::GenerateRequest long_request = TextRequest("long", 58);  // about 6 s
  long_request.mutable_sampling()->set_ignore_eos(true);
  auto reader_a = stub->GenerateStream(context_a.get(), long_request);
  v1::GenerateStreamResponse message;
  ASSERT_TRUE(reader_a->Read(&message));
  auto context_b = ContextWithDeadline(60);
  auto reader_b = stub->GenerateStream(context_b.get(), long_request);
  v1::ModelInfo info;
  for (int i = 0; i < 500 && info.cache().waiting_requests() != 1; ++i) {
    info = GetInfo(*stub);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(info.cache().waiting_requests(), 1) << info.DebugString();
  {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline(30);
    grpc::Status status = stub->Generate(context.get(), TextRequest("refused", 4), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("max-queue"), std::string::npos);
  }
  context_a->TryCancel();
  context_b->TryCancel();
  while (reader_a->Read(&message)) {
  }
  while (reader_b->Read(&message)) {
  }
  reader_a->Finish();
  reader_b->Finish();
  // The cancelled requests leave the engine at its next step.
  EXPECT_TRUE(WaitForIdleCache(*stub, &info)) << info.DebugString();

  // A request whose deadline passes leaves the batch; its blocks are freed.
  {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline(0.5);  // the request needs about 6 s
    grpc::Status status = stub->Generate(context.get(), long_request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
    EXPECT_TRUE(WaitForIdleCache(*stub, &info)) << info.DebugString();
  }

  // A message over --max-request-bytes is refused by gRPC itself.
  {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline(30);
    grpc::Status status =
        stub->Generate(context.get(), TextRequest(std::string(4000, 'x'), 4), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  }
  // The server still answers.
  {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline(30);
    grpc::Status status = stub->Generate(context.get(), TextRequest("fine", 4), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.token_ids_size(), 4);
  }
  EXPECT_TRUE(WaitForIdleCache(*stub, &info)) << info.DebugString();
}

// Behind a multiplexing proxy, many users share one HTTP/2 connection: a call
// with oversized metadata must fail alone. (gRPC answers headers over its
// transport limit by failing every call on the connection; with gRPC's
// default of 8 KiB, a 9 KiB header did that.)
TEST(LimitsTest, OversizedMetadataFailsOnlyItsOwnCall) {
  auto server = ServerProcess::Start({"--debug-step-delay-ms", "10"});  // default 16 KiB
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = (*server)->Channel();
  auto stub = v1::Generation::NewStub(channel);
  auto call = [&](size_t metadata_bytes, int tokens) {
    v1::GenerateResponse response;
    auto context = ContextWithDeadline(60);
    if (metadata_bytes > 0) context->AddMetadata("x-padding", std::string(metadata_bytes, 'a'));
    return stub->Generate(context.get(), TextRequest("neighbours", tokens), &response);
  };
  for (size_t oversized : {size_t{20000}, size_t{200000}}) {
    // The neighbour runs on the same channel (one connection) for about 0.5 s.
    grpc::Status neighbour;
    std::thread thread([&] { neighbour = call(0, 50); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(call(12000, 2).ok());  // above gRPC's default limit, below ours
    const grpc::Status refused = call(oversized, 2);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(refused.error_message().find("--max-metadata-bytes 16384"), std::string::npos)
        << refused.error_message();
    thread.join();
    EXPECT_TRUE(neighbour.ok()) << oversized << ": " << neighbour.error_message();
  }
}

}  // namespace
}  // namespace switchserve::testing
