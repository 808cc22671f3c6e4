// Minimal leveled logging to stderr, plus CHECK for broken invariants.
//
//   RECALL_LOG(INFO) << "loaded " << n << " tensors";
//   RECALL_CHECK(ptr != nullptr) << "pool not initialised";
//
// The level threshold comes from SetLogLevel() or the RECALL_LOG_LEVEL environment variable
// (DEBUG, INFO, WARNING, ERROR; default INFO). Thread safe: each message is written with
// one call to fwrite.
#pragma once

#include <sstream>
#include <string>

namespace recall {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the message; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
// Swallows the stream when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal
}  // namespace recall

#define RECALL_LOG_LEVEL_DEBUG ::recall::LogLevel::kDebug
#define RECALL_LOG_LEVEL_INFO ::recall::LogLevel::kInfo
#define RECALL_LOG_LEVEL_WARNING ::recall::LogLevel::kWarning
#define RECALL_LOG_LEVEL_ERROR ::recall::LogLevel::kError
#define RECALL_LOG_LEVEL_FATAL ::recall::LogLevel::kFatal

#define RECALL_LOG(level)                                                      \
  (RECALL_LOG_LEVEL_##level < ::recall::GetLogLevel())                         \
      ? (void)0                                                                \
      : ::recall::internal::LogVoidify() &                                     \
            ::recall::internal::LogMessage(RECALL_LOG_LEVEL_##level, __FILE__, \
                                           __LINE__)                           \
                .stream()

#define RECALL_CHECK(cond)                                                              \
  (cond) ? (void)0                                                                      \
         : ::recall::internal::LogVoidify() &                                           \
               ::recall::internal::LogMessage(::recall::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                        \
                   << "CHECK failed: " #cond " "
