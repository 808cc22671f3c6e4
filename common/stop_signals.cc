#include "common/stop_signals.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <ctime>

#include "absl/time/clock.h"

namespace recall {
namespace {

std::atomic<int> g_taken{0};  // a signal a thread without them blocked took

void Note(int sig) { g_taken.store(sig); }

}  // namespace

StopSignals::StopSignals(bool hangup) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  if (hangup) sigaddset(&set_, SIGHUP);
  struct sigaction action = {};
  action.sa_handler = Note;
  action.sa_flags = SA_RESTART;  // a slow call in the thread that runs it goes on
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  if (hangup) sigaction(SIGHUP, &action, nullptr);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
}

int StopSignals::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (const int sig = g_taken.exchange(0); sig != 0) return sig;
    const absl::Duration left = std::max(absl::ZeroDuration(), deadline - absl::Now());
    // (At least once, a pending one taken at once; at most 100 ms, then g_taken again.)
    const timespec wait = absl::ToTimespec(std::min(left, absl::Milliseconds(100)));
    if (const int sig = sigtimedwait(&set_, nullptr, &wait); sig > 0) return sig;
    if (left == absl::ZeroDuration()) return g_taken.exchange(0);
  }
}

void StopSignals::Ignore() {
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  if (sigismember(&set_, SIGHUP) == 1) std::signal(SIGHUP, SIG_IGN);
}

}  // namespace recall
