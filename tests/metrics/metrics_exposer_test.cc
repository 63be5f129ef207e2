#include "server/metrics/metrics_exposer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace switchserve {
namespace {

using Clock = std::chrono::steady_clock;

// A TCP connection to 127.0.0.1:`port`, or -1.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The whole answer to one GET /metrics on its own connection.
std::string Scrape(int port) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) answer.append(buffer, n);
  close(fd);
  return answer;
}

std::unique_ptr<MetricsExposer> StartExposer() {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("exposer_test_total").Help("test").Register(*registry).Add({});
  auto started = MetricsExposer::Start("127.0.0.1", 0, {registry});
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? std::move(*started) : nullptr;
}

// How long destroying `exposer` takes.
Clock::duration StopTime(std::unique_ptr<MetricsExposer> exposer) {
  const Clock::time_point start = Clock::now();
  exposer.reset();
  return Clock::now() - start;
}

// civetweb's listening thread polls 2 s at a time; stopping used to wait for
// the poll to end. Started, then left long enough for that poll to begin.
TEST(MetricsExposerTest, StopsWithoutWaitingForItsListenerToPoll) {
  std::unique_ptr<MetricsExposer> exposer = StartExposer();
  ASSERT_NE(exposer, nullptr);
  const int port = exposer->port();
  EXPECT_NE(Scrape(port).find("exposer_test_total 0"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(StopTime(std::move(exposer)), std::chrono::milliseconds(500));
  // Stopped: nothing listens there any more.
  const int fd = Connect(port);
  EXPECT_EQ(fd, -1);
  if (fd >= 0) close(fd);
}

// A scraper's connection that has not sent its request yet holds one of
// civetweb's threads; the stop does not wait for it.
TEST(MetricsExposerTest, StopsWithoutWaitingForAConnectionThatSentNothing) {
  std::unique_ptr<MetricsExposer> exposer = StartExposer();
  ASSERT_NE(exposer, nullptr);
  const int idle = Connect(exposer->port());
  ASSERT_GE(idle, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(StopTime(std::move(exposer)), std::chrono::milliseconds(500));
  close(idle);
}

// Stopping one exposer leaves another process-wide listener alone.
TEST(MetricsExposerTest, StoppingOneLeavesAnotherServing) {
  std::unique_ptr<MetricsExposer> first = StartExposer();
  std::unique_ptr<MetricsExposer> second = StartExposer();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  StopTime(std::move(first));
  EXPECT_NE(Scrape(second->port()).find("exposer_test_total 0"), std::string::npos);
}

}  // namespace
}  // namespace switchserve
