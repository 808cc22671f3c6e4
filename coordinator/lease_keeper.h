// LeaseKeeper: a thread that, every `period`, asks each registered in-progress reply to renew
// its lease if it has been silent. A reply's lease (StoredMessage::lease_unix_ms) is how
// coordinator replicas sharing a Redis store tell a running turn from one whose coordinator
// died: it is renewed with every write of the reply, so a turn with no token for a lease
// (a long prefill or rebuild, a queue on a busy worker) would read as interrupted while it
// runs, and a client's resume through another replica would run it twice. The journal
// (turn_journal.h) writes an empty part for it, which renews the lease.
//
// Thread safety: Add and Remove may be called from any thread; Remove returns only once no
// call of the removed one is in progress (a journal removes itself in its destructor).
#pragma once

#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace recall::coordinator {

class LeaseKeeper {
 public:
  // What the keeper calls: renew the lease if the last write is older than `idle_ms`. Must
  // not block (post the write to a thread that may).
  class Renewable {
   public:
    virtual ~Renewable() = default;
    virtual void RenewIfSilent(int64_t idle_ms) = 0;
  };

  // REQUIRES: period > 0. Calls RenewIfSilent(period in ms) every period.
  explicit LeaseKeeper(absl::Duration period);
  ~LeaseKeeper();  // stops and joins the thread
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  void Add(Renewable* r);
  void Remove(Renewable* r);

 private:
  void Loop();

  const absl::Duration period_;
  absl::Mutex mu_;
  std::set<Renewable*> renewables_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace recall::coordinator
