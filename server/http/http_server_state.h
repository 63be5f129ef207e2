// Internal to server/http: the state the HttpServer's listener
// (http_server.cc: accept, connection limits, Start and Stop) and its
// connections (http_session.cc) share, behind HttpServer's state_.
#ifndef SWITCHSERVE_SERVER_HTTP_HTTP_SERVER_STATE_H_
#define SWITCHSERVE_SERVER_HTTP_HTTP_SERVER_STATE_H_

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/byte_budget.h"
#include "server/http/http_server.h"
#include "server/http/http_session.h"

namespace switchserve {

// Everything the listener and the connections share. The io_context is the
// last member, so it is destroyed first: the connections its pending
// handlers still hold end while the rest of the state is alive.
struct HttpServerState {
  HttpServerOptions options;
  HttpHandler handler;
  std::optional<boost::asio::ssl::context> tls;
  std::shared_ptr<ByteBudget> body_budget;  // outlives the state in exchanges
  std::atomic<bool> stopping{false};
  std::atomic<int> port{0};

  std::mutex mu;
  std::condition_variable sessions_changed;
  std::list<std::weak_ptr<SessionBase>> sessions;
  int live_sessions = 0;
  bool stopped = false;
  std::vector<std::thread> threads;

  boost::asio::io_context ioc;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor;  // used on `acceptor_strand` only
  std::optional<boost::asio::strand<boost::asio::io_context::executor_type>> acceptor_strand;
  std::optional<boost::asio::steady_timer> accept_pause;  // on `acceptor_strand`

  int64_t OpenConnections() {
    std::lock_guard<std::mutex> lock(mu);
    return live_sessions;
  }
  // options.max_connections, or half the open-file limit in force.
  int64_t ConnectionLimit() const {
    if (options.max_connections > 0) return options.max_connections;
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
      return std::numeric_limits<int64_t>::max();
    }
    return std::max<int64_t>(1, static_cast<int64_t>(limit.rlim_cur / 2));
  }
  // The Access-Control-Allow-Origin of a request whose Origin header is
  // `origin`: "*", the origin itself, or empty when it is not allowed
  // (options.allowed_origins).
  std::string CorsOrigin(std::string_view origin) const {
    for (const std::string& allowed : options.allowed_origins) {
      if (allowed == "*") return allowed;
      if (allowed == origin) return std::string(origin);
    }
    return {};
  }
  std::string ErrorBody(int status, const std::string& message) const {
    return options.error_body ? options.error_body(status, message) : message;
  }
  void Accept();
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_HTTP_SERVER_STATE_H_
