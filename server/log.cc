#include "server/log.h"

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

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

// The length of the UTF-8 character that starts at `text[i]`; 0 when the
// bytes there are none (a continuation byte, an overlong form, a surrogate,
// past U+10FFFF, cut short).
size_t Utf8CharLength(std::string_view text, size_t i) {
  auto byte = [&](size_t k) -> int {
    return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : -1;
  };
  const int lead = byte(0);
  if (lead < 0x80) return 1;
  size_t length;
  int low = 0x80, high = 0xbf;  // the second byte's range (Unicode table 3-7)
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (byte(1) < low || byte(1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xbf) return 0;
  }
  return length;
}

void AppendEscape(unsigned code, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  switch (code) {
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    default:
      *out += "\\u00";
      out->push_back(kHex[(code >> 4) & 0xf]);
      out->push_back(kHex[code & 0xf]);
  }
}

// A value as it appears after `key=` in the text form: a string as it is
// when nothing in it needs escaping or separates fields, else quoted.
std::string TextValue(const nlohmann::ordered_json& value) {
  if (!value.is_string()) {
    return EscapeLogText(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                         false);
  }
  const std::string& text = value.get_ref<const std::string&>();
  if (!text.empty() && text.find_first_of(" \"=\\") == std::string::npos &&
      EscapeLogText(text, false) == text) {
    return text;
  }
  std::string quoted = "\"";
  quoted += EscapeLogText(text, true);
  quoted.push_back('"');
  return quoted;
}

}  // namespace

std::string EscapeLogText(std::string_view text, bool quoted) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8CharLength(text, i);
    const auto lead = static_cast<unsigned char>(text[i]);
    if (length == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
      continue;
    }
    if (length == 1 && (lead < 0x20 || lead == 0x7f)) {
      AppendEscape(lead, &out);
    } else if (length == 2 && lead == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) {
      AppendEscape(static_cast<unsigned char>(text[i + 1]), &out);  // U+0080 to U+009F
    } else if (quoted && (lead == '"' || lead == '\\')) {
      out.push_back('\\');
      out.push_back(static_cast<char>(lead));
    } else {
      out.append(text, i, length);
    }
    i += length;
  }
  return out;
}

bool LogLineBudget::Admit(Clock::time_point now, int64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ || now - window_start_ >= window_) {
    open_ = true;
    window_start_ = now;
    admitted_ = 0;
  }
  if (admitted_ >= lines_) {
    ++suppressed_;
    return false;
  }
  ++admitted_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

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
    // an exception; JSON escapes C0 controls, EscapeLogText DEL and C1 (in a
    // string, where alone they can appear, as the same \u escapes JSON reads).
    return EscapeLogText(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                         false);
  }
  std::string line(time_text);
  line += " switchserve: ";
  if (level != LogLevel::kInfo) line += std::string(LevelName(level)) + ": ";
  line += EscapeLogText(message, false);
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
