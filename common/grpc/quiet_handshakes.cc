#include "common/grpc/quiet_handshakes.h"

#include <grpc/support/log.h>

#include <cstdio>
#include <cstring>

#include "absl/time/clock.h"

namespace recall::grpcutil {

bool HandshakeLogLimiter::Admit(absl::Time now, int64_t* held_back) {
  absl::MutexLock lock(&mu_);
  if (now - last_ < kWindow) {
    ++held_;
    return false;
  }
  last_ = now;
  *held_back = held_;
  held_ = 0;
  return true;
}

namespace {

HandshakeLogLimiter& Limiter() {
  static HandshakeLogLimiter* const limiter = new HandshakeLogLimiter();
  return *limiter;
}

char SeverityLetter(gpr_log_severity s) {
  return s == GPR_LOG_SEVERITY_ERROR ? 'E' : s == GPR_LOG_SEVERITY_INFO ? 'I' : 'D';
}

void Log(gpr_log_func_args* args) {
  const char* file = std::strrchr(args->file, '/');
  file = file == nullptr ? args->file : file + 1;
  // A port it could not bind: the server's start says so itself, naming the flag and why
  // ("cannot listen on ...: Address already in use"), after this raw line.
  if (std::strstr(args->message, "No address added out of total") != nullptr) return;
  if (std::strstr(args->message, "Handshake failed") != nullptr) {
    int64_t held = 0;
    if (!Limiter().Admit(absl::Now(), &held)) return;
    if (held > 0) {
      std::fprintf(stderr, "%c grpc %s:%d] %s (and %lld more handshake failures, not printed)\n",
                   SeverityLetter(args->severity), file, args->line, args->message,
                   static_cast<long long>(held));
      return;
    }
  }
  std::fprintf(stderr, "%c grpc %s:%d] %s\n", SeverityLetter(args->severity), file, args->line,
               args->message);
}

}  // namespace

void QuietHandshakeLogs() { gpr_set_log_function(&Log); }

}  // namespace recall::grpcutil
