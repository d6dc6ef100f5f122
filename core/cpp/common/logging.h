// Rank-prefixed logging to stderr. Level from BYTEPS_LOG_LEVEL (TRACE, DEBUG, INFO, WARNING,
// ERROR), read once at init. Lines look like:
//   [byteps worker 1 WARNING 05:53:01.123] message
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>

namespace byteps {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kOff = 5 };

bool ParseLogLevel(const std::string& s, LogLevel* out);
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogHideTime(bool hide);
// e.g. "worker 1", "server 0", "scheduler"
void SetLogIdentity(const std::string& who);
const std::string& LogIdentity();

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  std::ostringstream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

struct LogVoidify {
  void operator&(std::ostream&) {}
};

inline bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= static_cast<int>(GetLogLevel()); }

// Bounds log lines about what peers send (rejected connections, malformed frames): Allow()
// says yes at most once per interval; then *more is the text to append to the line, naming how
// many were refused since (" (and 12 more since the last report)", or "" if none).
class LogLimiter {
 public:
  explicit LogLimiter(double interval_s = 1.0) : interval_(interval_s) {}
  bool Allow(std::string* more) {
    std::lock_guard<std::mutex> lk(mu_);
    auto now = std::chrono::steady_clock::now();
    if (last_.time_since_epoch().count() != 0 && now - last_ < interval_) {
      skipped_++;
      return false;
    }
    last_ = now;
    *more = skipped_ ? " (and " + std::to_string(skipped_) + " more since the last report)" : "";
    skipped_ = 0;
    return true;
  }

 private:
  std::chrono::duration<double> interval_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};
  uint64_t skipped_ = 0;
};

}  // namespace byteps

#define BPS_LOG_LEVEL_TRACE ::byteps::LogLevel::kTrace
#define BPS_LOG_LEVEL_DEBUG ::byteps::LogLevel::kDebug
#define BPS_LOG_LEVEL_INFO ::byteps::LogLevel::kInfo
#define BPS_LOG_LEVEL_WARNING ::byteps::LogLevel::kWarning
#define BPS_LOG_LEVEL_ERROR ::byteps::LogLevel::kError
// Expression form (no dangling else): the stream is only built when the level is enabled.
#define BPS_LOG(level)                                \
  !::byteps::LogEnabled(BPS_LOG_LEVEL_##level)        \
      ? (void)0                                       \
      : ::byteps::LogVoidify() & ::byteps::LogMessage(BPS_LOG_LEVEL_##level).stream()
