#include "coordinator/connection_threads.h"

#include <utility>
#include <vector>

namespace recall::coordinator {

void ConnectionThreads::enqueue(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  JoinEnded();
  if (running_ >= max_threads_) {
    queue_.push_back(std::move(task));
    return;
  }
  ++running_;
  Runner* runner = &runners_.emplace_back();
  runner->thread = std::thread(
      [this, runner, task = std::move(task)]() mutable { Serve(runner, std::move(task)); });
}

void ConnectionThreads::Serve(Runner* runner, std::function<void()> task) {
  while (true) {
    task();
    absl::MutexLock lock(&mu_);
    if (queue_.empty()) {
      --running_;
      runner->done = true;  // joined by the next enqueue or shutdown, never by itself
      return;
    }
    task = std::move(queue_.front());
    queue_.pop_front();
  }
}

void ConnectionThreads::JoinEnded() {
  for (auto it = runners_.begin(); it != runners_.end();) {
    if (it->done) {
      it->thread.join();  // it set done holding mu_ as its last step: it ends at once
      it = runners_.erase(it);
    } else {
      ++it;
    }
  }
}

void ConnectionThreads::shutdown() {
  std::list<Runner> all;
  {
    absl::MutexLock lock(&mu_);
    all.splice(all.end(), runners_);
  }
  for (Runner& r : all) {
    if (r.thread.joinable()) r.thread.join();
  }
}

int ConnectionThreads::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace recall::coordinator
