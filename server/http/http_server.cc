#include "server/http/http_server.h"

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/http/http_server_state.h"
#include "server/http/http_session.h"

namespace switchserve {
namespace {

namespace beast = boost::beast;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

std::string PeerName(const tcp::endpoint& endpoint) {
  const net::ip::address address = endpoint.address();
  if (address.is_v4()) return absl::StrCat("ipv4:", address.to_string(), ":", endpoint.port());
  return absl::StrCat("ipv6:[", address.to_string(), "]:", endpoint.port());
}

}  // namespace

void HttpServerState::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
    if (ec) {
      // Out of file descriptors (EMFILE) or memory: the connection stays in
      // the backlog and the next accept fails at once. Accepting again
      // without a pause spun the I/O threads at 100% until connections closed.
      accept_pause->expires_after(std::chrono::milliseconds(50));
      accept_pause->async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec && acceptor->is_open()) Accept();
      });
      return;
    }
    if (const int64_t limit = ConnectionLimit(); OpenConnections() >= limit) {
      // Closed at once, unanswered and unread: its client sees the
      // connection end (or reset, if its request was in flight) and may
      // retry, here or at another replica. Counted first, so that a client
      // that saw the close finds it in the metrics.
      if (options.on_connection_refused) options.on_connection_refused(limit);
      beast::error_code ignored;
      socket.close(ignored);
    } else if (!stopping) {
      beast::error_code peer_error;
      std::string peer = PeerName(socket.remote_endpoint(peer_error));
      if (tls) {
        StartSession(this, beast::ssl_stream<beast::tcp_stream>(std::move(socket), *tls),
                     std::move(peer));
      } else {
        StartSession(this, beast::tcp_stream(std::move(socket)), std::move(peer));
      }
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  auto state = std::make_unique<HttpServerState>();
  state->options = options;
  state->handler = std::move(handler);
  state->body_budget = std::make_shared<ByteBudget>(options.max_buffered_body_bytes);
  beast::error_code ec;
  if (options.tls.enabled()) {
    state->tls.emplace(ssl::context::tls_server);
    ssl::context& tls = *state->tls;
    tls.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                        ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                    ec);
    // TLS 1.2 with forward secrecy and AEAD only, as gRPC's port offers (no
    // CBC or SHA-1 suites); TLS 1.3's suites are all of that kind.
    if (SSL_CTX_set_cipher_list(tls.native_handle(), "ECDHE+AESGCM:ECDHE+CHACHA20") != 1) {
      return absl::InternalError("TLS: OpenSSL has none of the ECDHE AEAD cipher suites");
    }
    if (tls.use_certificate_chain_file(options.tls.cert_file, ec); ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.tls.cert_file, ": cannot use the certificate: ", ec.message()));
    }
    if (tls.use_private_key_file(options.tls.key_file, ssl::context::pem, ec); ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.tls.key_file, ": cannot use the private key: ", ec.message()));
    }
    if (!options.tls.client_ca_file.empty()) {
      if (tls.load_verify_file(options.tls.client_ca_file, ec); ec) {
        return absl::InvalidArgumentError(
            absl::StrCat(options.tls.client_ca_file, ": cannot use the CA bundle: ", ec.message()));
      }
      tls.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
  }
  const net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad --host \"", options.host, "\""));
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.port));
  state->acceptor_strand.emplace(net::make_strand(state->ioc));
  state->acceptor.emplace(*state->acceptor_strand);
  state->accept_pause.emplace(*state->acceptor_strand);
  tcp::acceptor& acceptor = *state->acceptor;
  auto cannot_listen = [&](const char* what) {
    return absl::UnavailableError(absl::StrCat("HTTP: cannot listen on ", options.host, ":",
                                               options.port, " (", what, ": ", ec.message(), ")"));
  };
  if (acceptor.open(endpoint.protocol(), ec); ec) return cannot_listen("open");
  if (acceptor.set_option(net::socket_base::reuse_address(true), ec); ec) {
    return cannot_listen("SO_REUSEADDR");
  }
  if (acceptor.bind(endpoint, ec); ec) return cannot_listen("bind");
  if (acceptor.listen(net::socket_base::max_listen_connections, ec); ec) {
    return cannot_listen("listen");
  }
  state->port = acceptor.local_endpoint().port();
  net::dispatch(*state->acceptor_strand, [s = state.get()] { s->Accept(); });
  // The threads start once the server owns the state: a thread the system
  // refuses to create (std::system_error) ends the start with those started
  // before it stopped and joined by ~HttpServer; destroyed running, they
  // ended the process (std::terminate).
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(state)));
  HttpServerState& started = *server->state_;
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    started.threads.emplace_back([s = &started] { s->ioc.run(); });
  }
  return server;
}

HttpServer::HttpServer(std::unique_ptr<HttpServerState> state) : state_(std::move(state)) {}

HttpServer::~HttpServer() { Stop(std::chrono::milliseconds(0)); }

int HttpServer::port() const { return state_->port; }

void HttpServer::Stop(std::chrono::milliseconds timeout) {
  HttpServerState& state = *state_;
  std::vector<std::shared_ptr<SessionBase>> sessions;
  {
    std::lock_guard<std::mutex> lock(state.mu);
    if (state.stopped) return;
    state.stopped = true;
    for (const auto& weak : state.sessions) {
      if (auto session = weak.lock()) sessions.push_back(std::move(session));
    }
  }
  state.stopping = true;
  net::dispatch(*state.acceptor_strand, [&state] {
    beast::error_code ignored;
    state.acceptor->close(ignored);
    state.accept_pause->cancel();
  });
  for (const auto& session : sessions) session->Shutdown(/*force=*/false);
  sessions.clear();  // the sessions' own handlers keep them alive
  {
    std::unique_lock<std::mutex> lock(state.mu);
    state.sessions_changed.wait_for(lock, timeout, [&] { return state.live_sessions == 0; });
    for (const auto& weak : state.sessions) {
      if (auto session = weak.lock()) sessions.push_back(std::move(session));
    }
  }
  for (const auto& session : sessions) session->Shutdown(/*force=*/true);
  sessions.clear();
  {
    std::unique_lock<std::mutex> lock(state.mu);
    state.sessions_changed.wait_for(lock, std::chrono::seconds(1),
                                    [&] { return state.live_sessions == 0; });
  }
  state.ioc.stop();
  for (std::thread& thread : state.threads) thread.join();
  state.threads.clear();
}

}  // namespace switchserve
