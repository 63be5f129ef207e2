// The HTTP server's stop (HttpServer::Stop), over a loopback connection whose
// client sends a request and reads nothing.
#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace switchserve {
namespace {

// A client connected to 127.0.0.1:`port` that sent one request and reads
// nothing, with a small receive buffer so that a response fills it quickly.
class SilentClient {
 public:
  explicit SilentClient(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    const int receive_bytes = 4096;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_bytes, sizeof(receive_bytes));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
    const std::string request = "GET /stream HTTP/1.1\r\nhost: test\r\n\r\n";
    sent_ = connected_ &&
            ::send(fd_, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size());
  }
  ~SilentClient() { ::close(fd_); }
  bool sent() const { return sent_; }

 private:
  const int fd_;
  bool connected_ = false;
  bool sent_ = false;
};

bool WaitFor(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A stream whose pieces are made on the connection's thread, each slowly:
// when the stop comes, thousands of them wait there behind the write that
// the silent client holds. The stop ended the response only after those:
// its 1 s wait for the forced close ran out first, the I/O threads stopped,
// and the connection, with its exchange, was never closed. The exchange's
// on_gone never ran (the request was never logged) and both leaked.
TEST(HttpServerStop, EndsAStreamWhosePiecesStillWaitOnItsThread) {
  constexpr int kPieces = 5000;
  constexpr auto kRenderTime = std::chrono::milliseconds(1);
  std::atomic<int> rendered{0};
  std::weak_ptr<HttpExchange> answered;
  std::mutex mu;
  std::optional<absl::Status> gone;  // under mu
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.threads = 1;
  options.max_stream_buffer_bytes = int64_t{1} << 40;
  auto started = HttpServer::Start(options, [&](std::shared_ptr<HttpExchange> exchange) {
    answered = exchange;
    exchange->OnClientGone([&](const absl::Status& why) {
      std::lock_guard<std::mutex> lock(mu);
      gone = why;
    });
    HttpResponse head;
    head.content_type = "text/event-stream";
    exchange->StartStream(std::move(head));
    for (int i = 0; i < kPieces; ++i) {
      exchange->WriteRendered([&rendered, kRenderTime] {
        std::this_thread::sleep_for(kRenderTime);
        rendered.fetch_add(1);
        return std::string(64 << 10, 'x');
      });
    }
    exchange->End();
  });
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<HttpServer> server = std::move(*started);
  SilentClient client(server->port());
  ASSERT_TRUE(client.sent());
  ASSERT_TRUE(WaitFor([&] { return rendered.load() >= 100; }, std::chrono::seconds(60)))
      << "the stream did not start";

  server->Stop(std::chrono::milliseconds(0));

  std::optional<absl::Status> why;
  {
    std::lock_guard<std::mutex> lock(mu);
    why = gone;
  }
  ASSERT_TRUE(why.has_value()) << "the response was not ended: " << rendered.load() << " of "
                               << kPieces << " pieces made";
  EXPECT_EQ(why->code(), absl::StatusCode::kUnavailable) << *why;
  EXPECT_TRUE(answered.expired()) << "the connection still holds the exchange";
  EXPECT_LT(rendered.load(), kPieces) << "the pieces still queued were made after the stop";
}

}  // namespace
}  // namespace switchserve
