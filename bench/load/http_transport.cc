#include "bench/load/http_transport.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>
#include <utility>

#include "nlohmann/json.hpp"

namespace switchserve::bench {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// The usage event's completion_tokens, or -1 when it has none.
int64_t CompletionTokens(const std::string& json) {
  const nlohmann::json chunk = nlohmann::json::parse(json, nullptr, false);
  if (!chunk.is_object()) return -1;
  const auto usage = chunk.find("usage");
  if (usage == chunk.end() || !usage->is_object()) return -1;
  const auto tokens = usage->find("completion_tokens");
  return tokens != usage->end() && tokens->is_number_integer() ? tokens->get<int64_t>() : -1;
}

// One streaming completion on its own connection; ends by telling
// `progress`, after which nothing refers to it.
class StreamingPost : public std::enable_shared_from_this<StreamingPost> {
 public:
  StreamingPost(net::io_context& ioc, tcp::endpoint endpoint,
                http::request<http::string_body> request, double timeout_s,
                RequestProgress* progress)
      : stream_(net::make_strand(ioc)),
        endpoint_(endpoint),
        request_(std::move(request)),
        timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000))),
        progress_(progress) {}

  void Run() {
    stream_.expires_after(timeout_);
    stream_.async_connect(endpoint_, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->Done("connect: " + ec.message());
      beast::error_code ignored;
      self->stream_.socket().set_option(tcp::no_delay(true), ignored);
      http::async_write(self->stream_, self->request_, [self](beast::error_code error, size_t) {
        if (error) return self->Done("write: " + error.message());
        self->ReadHeader();
      });
    });
  }

 private:
  void ReadHeader() {
    parser_.body_limit(boost::none);
    http::async_read_header(
        stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->Done("read: " + ec.message());
          if (self->parser_.get().result_int() != 200) {
            return self->Done("HTTP " + std::to_string(self->parser_.get().result_int()));
          }
          self->ReadBody();
        });
  }

  void ReadBody() {
    on_chunk_ = [this](std::uint64_t, beast::string_view data, beast::error_code&) {
      events_.append(data.data(), data.size());
      TakeEvents();
      return data.size();
    };
    parser_.on_chunk_body(on_chunk_);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->Done("read: " + ec.message());
                       if (!self->done_) return self->Done("the stream ended without [DONE]");
                       // A stream that ended well always has its usage event.
                       if (!self->usage_ && self->error_.empty()) {
                         return self->Done("the stream ended without a usage event");
                       }
                       self->Done("");
                     });
  }

  // Counts the tokens of the complete events received so far. An event may
  // carry several tokens (--stream-interval, or tokens merged while the
  // server still wrote the previous event) and its text does not say how
  // many; only "logprobs" would list them, at the cost of a log-softmax per
  // token in the server's sampler. So the first event, which carries the
  // first token, counts one, and the usage event at the end (asked for with
  // stream_options.include_usage) brings the count up to its
  // completion_tokens: TTFT, TPOT and the total are then exact.
  void TakeEvents() {
    size_t end;
    while ((end = events_.find("\n\n")) != std::string::npos) {
      const std::string event = events_.substr(0, end);
      events_.erase(0, end + 2);
      if (event == "data: [DONE]") {
        done_ = true;
      } else if (event.rfind("data: {\"error\"", 0) == 0) {
        error_ = event.substr(6);
      } else if (event.find("\"choices\":[{") != std::string::npos) {
        if (tokens_ == 0) Count(1);
      } else if (event.find("\"choices\":[]") != std::string::npos) {
        const int64_t tokens = CompletionTokens(event.substr(6));
        if (tokens < 0) {
          error_ = "a usage event without completion_tokens: " + event.substr(6);
          continue;
        }
        usage_ = true;
        Count(tokens - tokens_);
      }
    }
  }

  void Count(int64_t tokens) {
    if (tokens <= 0) return;
    tokens_ += tokens;
    progress_->OnTokens(static_cast<int>(tokens));
  }

  void Done(const std::string& error) {
    if (progress_ == nullptr) return;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    const std::string problem = error.empty() ? error_ : error;
    RequestProgress* progress = std::exchange(progress_, nullptr);
    progress->OnDone(problem.empty(), problem);
  }

  beast::tcp_stream stream_;
  const tcp::endpoint endpoint_;
  http::request<http::string_body> request_;
  const std::chrono::milliseconds timeout_;
  RequestProgress* progress_;
  beast::flat_buffer buffer_;
  http::response_parser<http::empty_body> parser_;
  std::function<std::size_t(std::uint64_t, beast::string_view, beast::error_code&)> on_chunk_;
  std::string events_;
  std::string error_;
  int64_t tokens_ = 0;  // counted so far
  bool usage_ = false;  // the usage event came
  bool done_ = false;
};

}  // namespace

struct HttpTransport::Impl {
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::thread thread;
  tcp::endpoint endpoint;
  std::string host_header;
  nlohmann::json body;
  std::string token;
  double timeout_s = 0;
};

HttpTransport::HttpTransport(std::string host, int port, const v1::GenerateRequest& request,
                             std::string token, double timeout_s)
    : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = tcp::endpoint(net::ip::make_address(host), static_cast<unsigned short>(port));
  impl_->host_header = host + ":" + std::to_string(port);
  nlohmann::json& body = impl_->body;
  if (request.has_token_ids()) {
    body["prompt"] =
        std::vector<int32_t>(request.token_ids().ids().begin(), request.token_ids().ids().end());
  } else {
    body["prompt"] = request.text();
  }
  const v1::SamplingParams& sampling = request.sampling();
  body["max_tokens"] = sampling.max_new_tokens();
  body["temperature"] = sampling.temperature();
  body["ignore_eos"] = sampling.ignore_eos();
  if (request.priority() != 0) body["priority"] = request.priority();
  body["stream"] = true;
  // The token count, which the events themselves do not give (TakeEvents).
  body["stream_options"] = {{"include_usage", true}};
  impl_->token = std::move(token);
  impl_->timeout_s = timeout_s;
  impl_->work.emplace(net::make_work_guard(impl_->ioc));
  impl_->thread = std::thread([impl = impl_.get()] { impl->ioc.run(); });
}

HttpTransport::~HttpTransport() {
  impl_->work.reset();
  impl_->thread.join();
}

void HttpTransport::Start(uint64_t seed, RequestProgress* progress) {
  nlohmann::json body = impl_->body;
  body["seed"] = seed;
  if (body["prompt"].is_array()) VaryTail(seed, body["prompt"]);
  http::request<http::string_body> request(http::verb::post, "/v1/completions", 11);
  request.set(http::field::host, impl_->host_header);
  request.set(http::field::content_type, "application/json");
  if (!impl_->token.empty()) request.set(http::field::authorization, "Bearer " + impl_->token);
  request.body() = body.dump();
  request.prepare_payload();
  std::make_shared<StreamingPost>(impl_->ioc, impl_->endpoint, std::move(request), impl_->timeout_s,
                                  progress)
      ->Run();
}

}  // namespace switchserve::bench
