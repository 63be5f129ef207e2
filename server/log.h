// The server's log: one line per event on stderr, as text
// (`2024-05-01T12:00:00.123Z switchserve: message key=value ...`) or as one
// JSON object per line (`{"time": ..., "level": ..., "msg": ..., key: value}`),
// chosen once at start-up by --log-format. Fields carry what a log system
// indexes (request_id, status, ...); in the text form they follow the message
// as key=value, strings quoted when they hold spaces or quotes.
//
// Thread-safe: lines from different threads never interleave.
#ifndef SWITCHSERVE_SERVER_LOG_H_
#define SWITCHSERVE_SERVER_LOG_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace switchserve {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

// "text" or "json"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

// Applies to every line written afterwards (default: text).
void SetLogFormat(LogFormat format);

// A JSON object of fields, in the order they are written (null or empty: none). Field names must
// not be `time`, `level` or `msg`.
using LogFields = nlohmann::ordered_json;

// Formats one line (without the trailing newline), at `time_text`
// (RFC 3339, UTC). Exposed for tests.
std::string FormatLogLine(LogFormat format, std::string_view time_text, LogLevel level,
                          std::string_view message, const LogFields& fields);

// Writes one line to stderr, now.
void Log(LogLevel level, std::string_view message, const LogFields& fields = {});
inline void LogInfo(std::string_view message, const LogFields& fields = {}) {
  Log(LogLevel::kInfo, message, fields);
}

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_LOG_H_
