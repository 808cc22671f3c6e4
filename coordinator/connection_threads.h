// ConnectionThreads: the HTTP edge's task queue for cpp-httplib, one thread per connection.
//
// cpp-httplib serves a connection on one task from its accept until it closes (idle
// keep-alive time and a slow client's bytes included). On a fixed pool, 64 slow or busy
// clients held every thread and the API answered no one else (found by probing). Here each
// connection gets a thread of its own at once, up to `max_threads` at a time; connections
// past that wait in order for a thread to end. Threads that ended are joined as new ones
// start, and all of them by shutdown(). When no thread can be started (a process limit),
// the connection waits for a running one, or with none running is served on the caller's
// (the accepting) thread.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace recall::coordinator {

class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(int max_threads) : max_threads_(max_threads) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> task) override;
  // Waits for every connection's task (queued ones run first) and joins the threads.
  void shutdown() override;

  int running() const;  // threads serving connections now

 private:
  struct Runner {
    std::thread thread;
    bool done = false;
  };
  // Runs `task`, then queued tasks, until the queue is empty.
  void Serve(Runner* runner, std::function<void()> task);
  void JoinEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::list<Runner> runners_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool warned_ ABSL_GUARDED_BY(mu_) = false;  // that a thread could not be started
};

}  // namespace recall::coordinator
