// The server's log: one line per event on stderr, as text
// (`2024-05-01T12:00:00.123Z switchserve: message key=value ...`) or as one
// JSON object per line (`{"time": ..., "level": ..., "msg": ..., key: value}`),
// chosen once at start-up by --log-format. Fields carry what a log system
// indexes (request_id, status, ...); in the text form they follow the message
// as key=value, strings quoted when they hold spaces, quotes or characters
// that are escaped. Neither form lets a message or a value (which may hold
// what a client sent: a header that gRPC quotes, a path) start a line of its
// own or reach a terminal as a control sequence: control characters are
// written as escapes (EscapeLogText).
//
// Thread-safe: lines from different threads never interleave.
#ifndef SWITCHSERVE_SERVER_LOG_H_
#define SWITCHSERVE_SERVER_LOG_H_

#include <chrono>
#include <cstdint>
#include <mutex>
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

// `text` as the log writes it: C0 control characters (CR, LF, ESC, ...), DEL
// and C1 control characters (U+0080 to U+009F) as JSON-style escapes (`\n`,
// `\r`, `\t`, else `\u001b`, `\u007f`, `\u009b`), and each byte that is no
// part of a UTF-8 character as U+FFFD. With `quoted`, `"` and `\` are
// escaped too (`\"`, `\\`): the inside of a quoted value, a JSON string's.
// The text form's message and field values both go through it; so does a
// JSON line, whose strings JSON escapes C0 in already.
std::string EscapeLogText(std::string_view text, bool quoted);

// A limit on lines of one source: at most `lines` in each `window` (a window
// opens with the first line after the previous one closed). Lines past it are
// dropped and counted; the next line admitted reports how many.
//
// Thread-safe.
class LogLineBudget {
 public:
  using Clock = std::chrono::steady_clock;
  LogLineBudget(int lines, Clock::duration window) : lines_(lines), window_(window) {}

  // Whether a line at `now` may be written; when it may, `*suppressed` is the
  // number dropped since the last line admitted.
  bool Admit(Clock::time_point now, int64_t* suppressed);

 private:
  const int lines_;
  const Clock::duration window_;
  std::mutex mu_;
  bool open_ = false;  // a window has opened
  Clock::time_point window_start_;
  int admitted_ = 0;  // in the current window
  int64_t suppressed_ = 0;
};

// Writes one line to stderr, now.
void Log(LogLevel level, std::string_view message, const LogFields& fields = {});
inline void LogInfo(std::string_view message, const LogFields& fields = {}) {
  Log(LogLevel::kInfo, message, fields);
}

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_LOG_H_
