// Internal to server/http: one connection of the HttpServer (http_session.cc),
// as the listener (http_server.cc) starts it and holds it. A session reads
// the connection's requests, hands each to the handler through an
// HttpExchange, writes the responses in order, watches the socket for the
// client's disconnect while a response is pending and bounds the written data
// a streamed response's client leaves unread (HttpServerOptions).
#ifndef SWITCHSERVE_SERVER_HTTP_HTTP_SESSION_H_
#define SWITCHSERVE_SERVER_HTTP_HTTP_SESSION_H_

#include <string>

namespace switchserve {

struct HttpServerState;  // http_server_state.h
struct OutPiece;         // http_exchange.h

// The part of a connection an exchange talks to.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  // Queues `piece` for the connection (from any thread).
  virtual void Send(OutPiece piece) = 0;
  // From any thread: close the connection if it has no request in progress
  // (or in any case, with `force`).
  virtual void Shutdown(bool force) = 0;
};

// Starts a session on an accepted connection: plaintext (a
// boost::beast::tcp_stream) or TLS (a boost::beast::ssl_stream over one), the
// two Streams http_session.cc instantiates it for. The session registers in
// `state` and keeps itself alive through its pending handlers.
template <class Stream>
void StartSession(HttpServerState* state, Stream stream, std::string peer);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_HTTP_SESSION_H_
