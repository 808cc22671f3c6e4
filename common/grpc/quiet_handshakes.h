// gRPC's own log lines, with its "Handshake failed" lines held to one per kWindow: every
// client that cannot complete TLS (a port scanner, plaintext on a TLS port, an expired client
// certificate) made gRPC log an ERROR line, so a probe loop flooded the coordinator's log and
// hid everything else. The first of a window is printed; the count of those held back is said
// with the next one printed. Its "No address added" line for a port it could not bind is
// left out (the server's start says so, naming the flag). Other gRPC lines print as gRPC
// prints them.
#pragma once

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace recall::grpcutil {

// Which handshake failures to print: Admit says whether the one at `now` is, and how many
// were held back since the last printed (0 when none).
class HandshakeLogLimiter {
 public:
  static constexpr absl::Duration kWindow = absl::Seconds(10);
  bool Admit(absl::Time now, int64_t* held_back);

 private:
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

// Installs the limit as gRPC's log function (process-wide; call once in a main, before the
// servers start).
void QuietHandshakeLogs();

}  // namespace recall::grpcutil
