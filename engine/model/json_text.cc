#include "engine/model/json_text.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace switchserve {

namespace {

// Far beyond what a config.json (3 levels) or a safetensors header (3) holds.
constexpr int kMaxFileJsonDepth = 64;

}  // namespace

bool NestsDeeperThan(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

absl::StatusOr<nlohmann::json> ParseJsonText(std::string_view text, std::string_view file_name) {
  // nlohmann's lexer takes a NUL byte for the end of the input: a valid
  // document followed by "\0" and anything would parse. JSON text has no NUL
  // outside strings, and inside them only escaped.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(file_name), ": invalid JSON at byte ", nul, ": a NUL byte"));
  }
  if (NestsDeeperThan(text, kMaxFileJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(file_name),
                                                   ": nests arrays and objects more than ",
                                                   kMaxFileJsonDepth, " levels deep"));
  }
  // One set of seen keys per open object; the parser callback sees every key
  // in document order, so a repeat is found before nlohmann overwrites it.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate_key;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                      nlohmann::json& parsed) -> bool {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate_key.empty()) {
          duplicate_key = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text.begin(), text.end(), callback,
                                     /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, ...".
    std::string_view what = e.what();
    if (const size_t bracket = what.find("] "); bracket != std::string_view::npos) {
      what.remove_prefix(bracket + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(file_name), ": invalid JSON at byte ", e.byte, ": ", std::string(what)));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(file_name), ": invalid JSON: ", e.what()));
  }
  if (!duplicate_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(file_name), ": duplicate key \"", duplicate_key, "\""));
  }
  return document;
}

std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_object()) return "an object";
  if (value.is_array()) {
    // Dumping is recursive: only show flat arrays, so a hostile document
    // nested a million levels deep cannot exhaust the stack here.
    for (const nlohmann::json& element : value) {
      if (element.is_structured()) return absl::StrCat("an array of ", value.size(), " elements");
    }
  }
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) text = absl::StrCat(text.substr(0, kMaxChars), "...");
  return text;
}

}  // namespace switchserve
