// Clocks. Clock is an interface so that schedulers and timeouts can be tested with a fake;
// RealClock reads the monotonic clock. Thread safe.
#pragma once

#include <chrono>
#include <cstdint>

namespace recall {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds since an arbitrary epoch.
  virtual int64_t NowNanos() const = 0;
  double NowSeconds() const { return static_cast<double>(NowNanos()) * 1e-9; }
};

// Wall-clock milliseconds since the Unix epoch (for timestamps that outlive the process:
// stored records, leases shared between processes), not for measuring durations.
inline int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class RealClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance.
  static const RealClock& Get() {
    static const RealClock clock;
    return clock;
  }
};

// Measures elapsed wall time from construction (or the last Reset()).
class Stopwatch {
 public:
  explicit Stopwatch(const Clock& clock = RealClock::Get()) : clock_(clock) { Reset(); }
  void Reset() { start_ = clock_.NowNanos(); }
  double ElapsedSeconds() const { return static_cast<double>(clock_.NowNanos() - start_) * 1e-9; }

 private:
  const Clock& clock_;
  int64_t start_ = 0;
};

}  // namespace recall
