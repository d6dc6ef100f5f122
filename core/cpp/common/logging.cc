#include "logging.h"

#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace byteps {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<bool> g_hide_time{false};
std::mutex g_mu;
std::string& Identity() {
  static std::string* id = new std::string("byteps");
  return *id;
}
const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    default: return "OFF";
  }
}
}  // namespace

bool ParseLogLevel(const std::string& s, LogLevel* out) {
  std::string u = s;
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return std::toupper(c); });
  static const std::pair<const char*, LogLevel> kNames[] = {
      {"TRACE", LogLevel::kTrace}, {"DEBUG", LogLevel::kDebug},   {"INFO", LogLevel::kInfo},
      {"WARNING", LogLevel::kWarning}, {"WARN", LogLevel::kWarning}, {"ERROR", LogLevel::kError},
      {"FATAL", LogLevel::kError}, {"OFF", LogLevel::kOff}};
  for (auto& [name, lvl] : kNames) {
    if (u == name) {
      *out = lvl;
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogHideTime(bool hide) { g_hide_time = hide; }
void SetLogIdentity(const std::string& who) {
  std::lock_guard<std::mutex> lk(g_mu);
  Identity() = "byteps " + who;
}
const std::string& LogIdentity() { return Identity(); }

LogMessage::~LogMessage() {
  char ts[32] = "";
  if (!g_hide_time) {
    timeval tv;
    gettimeofday(&tv, nullptr);
    tm t;
    localtime_r(&tv.tv_sec, &t);
    snprintf(ts, sizeof(ts), " %02d:%02d:%02d.%03d", t.tm_hour, t.tm_min, t.tm_sec,
             static_cast<int>(tv.tv_usec / 1000));
  }
  std::lock_guard<std::mutex> lk(g_mu);
  fprintf(stderr, "[%s %s%s] %s\n", Identity().c_str(), LevelName(level_), ts, os_.str().c_str());
  fflush(stderr);
}

}  // namespace byteps
