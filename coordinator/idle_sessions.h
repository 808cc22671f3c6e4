// IdleSessions: a thread that deletes the sessions idle longer than a time to live
// (recall-coordinator --session-ttl), so that a store whose clients never delete their
// sessions (an OpenAI client starts one per conversation) stays bounded, and a tenant does
// not reach --max-sessions for good. Every `period` it deletes them from the store, oldest
// first (SessionStore::DeleteIdle: never one whose reply is being written), then forgets
// their episodes and asks their workers to drop their caches. Several coordinators sharing a
// store may each run one: a session is deleted once.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics/registry.h"
#include "coordinator/session_store.h"
#include "coordinator/worker_registry.h"

namespace recall::coordinator {

class IdleSessions {
 public:
  // REQUIRES: ttl > 0. `forget(tenant, id)` is called for each deleted session (the
  // coordinator's in-memory state of it).
  IdleSessions(SessionStore& store, const WorkerRegistry& workers, absl::Duration ttl,
               metrics::Registry& metrics,
               std::function<void(const std::string&, const std::string&)> forget);
  ~IdleSessions();  // stops and joins the thread
  IdleSessions(const IdleSessions&) = delete;
  IdleSessions& operator=(const IdleSessions&) = delete;

  // Deletes the sessions idle longer than the ttl now; how many. (The thread calls it.)
  int Sweep();

  // How often the thread sweeps: a quarter of the ttl, within [1 s, 60 s].
  static absl::Duration Period(absl::Duration ttl);

 private:
  void Loop();
  bool Stopping();

  SessionStore& store_;
  const WorkerRegistry& workers_;
  const absl::Duration ttl_;
  metrics::Counter* deleted_;
  const std::function<void(const std::string&, const std::string&)> forget_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace recall::coordinator
