// Strict JSON parsing shared by the config and safetensors readers. Internal to
// the engine (callers must link nlohmann_json): the public headers never expose
// nlohmann types.
#ifndef SWITCHSERVE_ENGINE_MODEL_JSON_TEXT_H_
#define SWITCHSERVE_ENGINE_MODEL_JSON_TEXT_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace switchserve {

// Parses `text` as one JSON document. No exception escapes: syntax errors
// (a NUL byte anywhere among them) become INVALID_ARGUMENT "<file_name>:
// invalid JSON at byte N: <reason>", and
// a key repeated inside one object is an error naming the key (nlohmann would
// silently keep the last value, which could hide a typo or a forged header).
absl::StatusOr<nlohmann::json> ParseJsonText(std::string_view text, std::string_view file_name);

// Whether `text` opens more than `max_depth` arrays and objects at once
// (brackets inside strings aside): a scan that stops at the first level too
// deep, whatever follows, and builds nothing. The parser builds every level
// it reads before it can tell (about 90 bytes each: a 100 MiB header of "["
// took gigabytes), so documents from outside are scanned first.
bool NestsDeeperThan(std::string_view text, int max_depth);

// A short rendering of a JSON value for error messages ("7", "\"abc\"",
// "[1,2]", "an object"), truncated when long.
std::string DescribeJson(const nlohmann::json& value);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_JSON_TEXT_H_
