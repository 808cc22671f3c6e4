// SIGINT and SIGTERM for a server's main thread to wait for (a stop, then a second one to
// stop waiting for running turns).
//
// Blocking them and calling sigwait is not enough: a thread that a library started before
// main (OpenBLAS's pool) does not block them, and the kernel gives it any signal that comes
// while the main thread is not waiting, whose default action then ends the process. So a
// handler notes a signal whichever thread takes it, and Wait sees both ways.
#pragma once

#include <csignal>

#include "absl/time/time.h"

namespace recall {

class StopSignals {
 public:
  // Installs the handler and blocks the signals in the calling thread (and in the threads it
  // starts from then on). Once per process. With `hangup`, SIGHUP is taken too (Wait returns
  // it: a reload, not a stop); otherwise its default action ends the process.
  explicit StopSignals(bool hangup = false);
  // The next SIGINT or SIGTERM (or SIGHUP, when taken) (its number), or 0 after `timeout`.
  int Wait(absl::Duration timeout = absl::InfiniteDuration());
  // From now on they are ignored (nothing waits for them any more).
  void Ignore();
  const sigset_t& set() const { return set_; }

 private:
  sigset_t set_;
};

}  // namespace recall
