#include "server/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace switchserve {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// A value as it appears after `key=` in the text form.
std::string TextValue(const nlohmann::ordered_json& value) {
  if (!value.is_string())
    return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string& text = value.get_ref<const std::string&>();
  const bool plain = !text.empty() && text.find_first_of(" \t\"=\\\n\r") == std::string::npos;
  return plain ? text : value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError("unknown log format \"" + std::string(name) +
                                    "\" (text | json)");
}

void SetLogFormat(LogFormat format) { g_format.store(format); }

std::string FormatLogLine(LogFormat format, std::string_view time_text, LogLevel level,
                          std::string_view message, const LogFields& fields) {
  if (format == LogFormat::kJson) {
    nlohmann::ordered_json line;
    line["time"] = time_text;
    line["level"] = LevelName(level);
    line["msg"] = message;
    if (fields.is_object()) {
      for (const auto& [key, value] : fields.items()) line[key] = value;
    }
    // Invalid UTF-8 (a client's request id, say) becomes U+FFFD rather than
    // an exception.
    return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line(time_text);
  line += " switchserve: ";
  if (level != LogLevel::kInfo) line += std::string(LevelName(level)) + ": ";
  line += message;
  if (fields.is_object()) {
    for (const auto& [key, value] : fields.items()) line += " " + key + "=" + TextValue(value);
  }
  return line;
}

void Log(LogLevel level, std::string_view message, const LogFields& fields) {
  const std::string time_text =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string line = FormatLogLine(g_format.load(), time_text, level, message, fields);
  line.push_back('\n');
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace switchserve
