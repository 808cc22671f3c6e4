// WorkPool: a fixed set of threads that run closures in the order they were given.
//
// For the coordinator's blocking work (session store I/O: SQLite writes are synchronous, Redis
// is a round trip) that must stay off gRPC's callback threads, which are few (a handful per
// process) and must never block.
//
// Thread safety: Run may be called from any thread, including from inside a closure.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace recall::coordinator {

class WorkPool {
 public:
  // REQUIRES: threads >= 1.
  explicit WorkPool(int threads);
  // Runs what was queued, then joins the threads. REQUIRES: no Run call after it starts.
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  void Run(std::function<void()> work);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace recall::coordinator
