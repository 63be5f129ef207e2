// A request as the HTTP server hands it to its handler (http_server.h).
#ifndef SWITCHSERVE_SERVER_HTTP_HTTP_REQUEST_H_
#define SWITCHSERVE_SERVER_HTTP_HTTP_REQUEST_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace switchserve {

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // the path and query as sent
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case
  std::string body;
  std::string peer;  // "ipv4:1.2.3.4:5678", as gRPC writes peers

  // The first header named `lower_case_name`, or nullopt.
  std::optional<std::string_view> Header(std::string_view lower_case_name) const {
    for (const auto& [name, value] : headers) {
      if (name == lower_case_name) return value;
    }
    return std::nullopt;
  }
  // The target without its query string.
  std::string_view Path() const {
    std::string_view path = target;
    return path.substr(0, path.find('?'));
  }
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_HTTP_REQUEST_H_
