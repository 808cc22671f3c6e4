#include "coordinator/connection_threads.h"

#include <system_error>
#include <utility>
#include <vector>

#include "common/logging.h"

namespace recall::coordinator {

void ConnectionThreads::enqueue(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    JoinEnded();
    if (running_ >= max_threads_) {
      queue_.push_back(std::move(task));
      return;
    }
    ++running_;
    Runner* runner = &runners_.emplace_back();
    try {
      runner->thread = std::thread([this, runner, task]() mutable { Serve(runner, task); });
      return;
    } catch (const std::system_error& e) {
      // No thread to be had (a process or memory limit): a running one takes the connection
      // after its own; with none running, it is served here, on the accepting thread.
      runners_.pop_back();
      --running_;
      if (!warned_) {
        RECALL_LOG(WARNING) << "HTTP: cannot start a thread for a connection (" << e.what()
                            << "); connections wait for the " << running_ << " running";
        warned_ = true;
      }
      if (running_ > 0) {
        queue_.push_back(std::move(task));
        return;
      }
    }
  }
  task();
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
