// WorkerRegistry: the workers a coordinator routes to, and their health and load.
//
// Workers are given by address (--workers) or added later with Add (a worker registering
// itself through recall.v1.Registry, see registry_service.h). A background thread calls
// every worker's GetLoad at once every `heartbeat` (each with a deadline of one second, so a
// worker that does not answer delays no other); that call is the heartbeat: a worker that
// misses `max_misses` in a row is marked down (no turns go to it, and the calls watching it
// are told: a worker that hangs fails its running turns over) and comes back when it
// answers again. Its Info is read again when it comes back, when it registers again and
// every tenth heartbeat, so a worker restarted on its address with another model or other
// flags is seen as it is now. Drain(address) keeps a worker serving its bound sessions'
// running turns but routes no new sessions to it, until it registers again (a restart).
// A worker that registered itself (not one of --workers) and stays down for `forget_after`
// is forgotten: one that restarted on another port, or went away for good, is not polled
// forever.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/cluster_credential.h"
#include "common/metrics/registry.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/worker.grpc.pb.h"

namespace recall::coordinator {

struct WorkerView {
  std::string address;
  bool healthy = false;
  bool draining = false;
  v1::LoadReport load;
  v1::InfoResponse info;
  std::shared_ptr<v1::Worker::Stub> stub;
};

// "; served: \"a\", \"b\"" naming the models workers serve, for a message about a model
// none serves; "" when none is served.
std::string ServedModelsSuffix(const std::vector<std::string>& served);

class WorkerRegistry {
 public:
  // With `metrics`, each worker gets gauges (up, sessions, free KV blocks, active and
  // queued turns) labelled worker="<address>".
  // `cluster` is attached to every call to a worker (Attach below for the callers' own).
  explicit WorkerRegistry(metrics::Registry* metrics = nullptr,
                          absl::Duration heartbeat = absl::Milliseconds(500), int max_misses = 3,
                          grpcutil::ClusterCredential cluster = grpcutil::ClusterCredential::Open(),
                          absl::Duration forget_after = absl::Minutes(10));
  ~WorkerRegistry();

  // `registered`: the worker registered itself (forgotten once down for forget_after), as
  // process `instance` (RegisterRequest.instance; "" unknown). A known address registering as
  // another instance is a restarted worker: polled again (its Info read anew) and no longer
  // draining; as the same one (the periodic repeat), nothing changes.
  void Add(const std::string& address, bool registered = false, const std::string& instance = "");
  // Whether a worker of that address is known (a drain of an unknown one does nothing).
  bool Drain(const std::string& address);
  // Marks a worker down at once (a stream to it broke); the heartbeat revives it.
  void ReportFailure(const std::string& address);
  // Polls every worker once now (also done by the background thread).
  void PollAll();

  // `on_down` runs on the registry's thread after each poll that finds the worker at `address`
  // marked down (heartbeats missed), until Unwatch(the id returned). It must not call the
  // registry.
  uint64_t Watch(const std::string& address, std::function<void()> on_down);
  void Unwatch(uint64_t id);

  // The workers (but one that serves a name in use with another model: not used).
  std::vector<WorkerView> Snapshot() const;
  // Why the worker at `address` is known but not used: its model conflicts, or it is marked
  // down (told to a worker that registers: one whose --advertise address the coordinator
  // cannot dial heard only "registered"); "" otherwise.
  std::string NotUsedReason(const std::string& address) const;
  // Whether the registry is young enough (kSettle) that workers of a model may not have
  // registered yet: after a coordinator's restart they register again within seconds.
  bool Settling() const { return absl::Now() - started_ < kSettle; }
  static constexpr absl::Duration kSettle = absl::Seconds(30);
  // The refusal of a turn of a session whose model no known worker serves (`served`: what
  // they serve): NotFound, or Unavailable (retryable) while Settling.
  absl::Status SessionModelNotServed(const std::string& model,
                                     const std::vector<std::string>& served) const;
  std::shared_ptr<v1::Worker::Stub> Stub(const std::string& address) const;
  // Adds the cluster credential to a call to a worker.
  void Attach(grpc::ClientContext* context) const { cluster_.Attach(context); }
  // Asks the worker at `address` to drop session `id`'s cache (a deleted session's), waiting
  // up to 2 s, unless it is down; best effort: the cache is derived state and would age out
  // anyway.
  void DropSession(const std::string& address, const std::string& id) const;
  // Has the worker at `address` drop session `id`'s cache once it answers (the registry's
  // thread sends it, without waiting for the answer, after the next heartbeat that finds the
  // worker up; kept while the worker is down or not known yet, as after a coordinator's
  // restart), unless a turn of the session runs there then (DropSessionRequest.if_idle): a
  // copy left behind when its session moved to another worker, or was deleted while a turn
  // of it ran. At most
  // kMaxPendingDrops wait (more are not kept: such copies age out of a worker's memory
  // anyway). KeepSession forgets one (its session came back to that worker).
  void DropLater(const std::string& address, const std::string& id);
  void KeepSession(const std::string& address, const std::string& id);
  // DropLater on every known worker.
  void DropEverywhere(const std::string& id);
  static constexpr size_t kMaxPendingDrops = 100000;
  static constexpr size_t kDropsPerHeartbeat = 256;
  size_t PendingDrops() const;

 private:
  struct Entry {
    WorkerView view;
    int misses = 0;
    bool refresh_info = true;  // read its Info at the next poll
    bool registered = false;   // through recall.v1.Registry, not --workers
    std::string instance;      // the process that registered last ("" unknown)
    std::shared_ptr<grpc::Channel> channel;  // view.stub's; kept for the registry's lifetime
    bool conflict = false;     // serves a name another worker serves with another model
    std::string conflict_reason;  // while `conflict`: why it is not used
    bool down_logged = false;  // said so since it last answered
    // While marked down: its last heartbeat's status code (a stable word, for NotUsedReason:
    // gRPC's messages for a refused connection vary from one try to the next); "" otherwise.
    std::string down_code;
    bool defaults_differ = false;  // said that its session defaults differ (SettleConflicts)
    bool weights_differ = false;   // said that its weights' type differs (SettleConflicts)
    absl::Time down_since = absl::InfiniteFuture();  // while marked down
  };
  void Loop();
  // Sends the pending drops of the workers that are up (DropLater).
  void DeliverDrops();
  // Two models under one name: a session would move between them (and its tokens change) when
  // its worker failed over. For each name, the model (context length, vocabulary, chat
  // format) most of its workers serve is used, ties to the one registered first; a worker
  // serving another is not (Entry::conflict), said once. By count, not by who came first:
  // after a coordinator restart the workers register again in any order. A worker whose
  // session defaults (Info.default_cache) differ from those of the first worker serving its
  // name is used, and that is said once: a new session takes the defaults of the worker that
  // checks it (the first answering), so the others' --policy/--budget apply to none. So is
  // one whose weights (Info.weights: int8 beside bf16) differ: a session's replies change
  // when it fails over between them.
  void SettleConflicts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls these workers at once and waits for every answer (or its deadline).
  void Poll(const std::vector<std::string>& addresses, bool refresh_all_info);
  // A worker's per-worker gauges, added when it is first known and removed once it is
  // forgotten (unless it is known again by then), under series_mu_.
  void AddSeries(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(series_mu_);
  void ForgetSeries(const std::vector<std::string>& addresses) ABSL_LOCKS_EXCLUDED(series_mu_);

  metrics::Registry* const metrics_;
  const absl::Duration heartbeat_;
  const int max_misses_;
  const grpcutil::ClusterCredential cluster_;
  const absl::Duration forget_after_;
  const absl::Time started_ = absl::Now();
  absl::Mutex series_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::vector<Entry> workers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  struct Watcher {
    std::string address;
    std::function<void()> on_down;
  };
  std::map<uint64_t, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(mu_) = 0;
  struct Pending {
    std::set<std::string> ids;
    absl::Time since;  // the first kept: an address not known for forget_after is let go
  };
  std::map<std::string, Pending> pending_drops_ ABSL_GUARDED_BY(mu_);  // by address
  size_t pending_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace recall::coordinator
