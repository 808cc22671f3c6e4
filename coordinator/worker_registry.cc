#include "coordinator/worker_registry.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "google/protobuf/util/message_differencer.h"

namespace recall::coordinator {
namespace {

// A worker's channel. gRPC's reconnect backoff grows to 120 s while the worker is down, so a
// worker back after a while was not dialled again for up to two minutes (it had registered
// and stayed unused): the backoff is capped at a second, a dial per second of a down worker.
// (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is the connect timeout.)
std::shared_ptr<grpc::Channel> WorkerChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::string WorkerLabel(const std::string& address) { return "worker=\"" + address + "\""; }

}  // namespace

WorkerRegistry::WorkerRegistry(metrics::Registry* metrics, absl::Duration heartbeat, int max_misses,
                               grpcutil::ClusterCredential cluster, absl::Duration forget_after)
    : metrics_(metrics),
      heartbeat_(heartbeat),
      max_misses_(max_misses),
      cluster_(std::move(cluster)),
      forget_after_(forget_after),
      thread_([this] { Loop(); }) {}

WorkerRegistry::~WorkerRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void WorkerRegistry::Add(const std::string& address, bool registered, const std::string& instance) {
  bool known = false, restarted = false;
  {
    // With the series: a forgotten worker's are removed unless it is back (ForgetSeries).
    absl::MutexLock series(&series_mu_);
    {
      absl::MutexLock lock(&mu_);
      for (Entry& e : workers_) {
        if (e.view.address != address) continue;
        known = true;
        if (instance.empty() || instance == e.instance) continue;  // the periodic repeat
        // Another process at this address: a worker restarted (maybe with another model or
        // other flags), no longer draining.
        restarted = !e.instance.empty();
        e.instance = instance;
        if (restarted) {
          e.view.draining = false;
          e.refresh_info = true;
          // Dialled now, not after the backoff: the channel stays (a turn's call may hold the
          // last reference to a replaced one, released on a gRPC thread).
          grpc::experimental::ChannelResetConnectionBackoff(e.channel.get());
        }
      }
      if (!known) {
        Entry e;
        e.registered = registered;
        e.instance = instance;
        e.view.address = address;
        e.channel = WorkerChannel(address);
        e.view.stub = v1::Worker::NewStub(e.channel);
        workers_.push_back(std::move(e));
      }
    }
    if (!known) AddSeries(address);
  }
  if (!known || restarted) Poll({address}, true);
}

void WorkerRegistry::AddSeries(const std::string& address) {
  if (metrics_ != nullptr) {
    const std::string label = WorkerLabel(address);
    auto gauge = [&](const char* name, const char* help, auto read) {
      metrics_->AddCallbackGauge(name, help, [this, address, read] {
        for (const WorkerView& w : Snapshot()) {
          if (w.address == address) return static_cast<double>(read(w));
        }
        return 0.0;
      }, label);
    };
    gauge("recall_coordinator_worker_up", "1 while the worker answers heartbeats",
          [](const WorkerView& w) { return w.healthy ? 1 : 0; });
    // A worker marked down holds nothing as far as the cluster is concerned: its last report
    // stayed (a dead worker's sessions counted twice once they had failed over).
    gauge("recall_coordinator_worker_sessions", "Session caches the worker holds (0 while down)",
          [](const WorkerView& w) {
            return w.healthy ? w.load.resident_sessions() + w.load.offloaded_sessions() : 0;
          });
    gauge("recall_coordinator_worker_kv_blocks_free", "Free KV blocks on the worker (0 while down)",
          [](const WorkerView& w) { return w.healthy ? w.load.kv_blocks_free() : 0; });
    gauge("recall_coordinator_worker_turns", "Active + queued turns on the worker (0 while down)",
          [](const WorkerView& w) {
            return w.healthy ? w.load.active_turns() + w.load.queued_turns() : 0;
          });
  }
}

void WorkerRegistry::ForgetSeries(const std::vector<std::string>& addresses) {
  if (metrics_ == nullptr) return;
  absl::MutexLock series(&series_mu_);
  for (const std::string& address : addresses) {
    {
      absl::MutexLock lock(&mu_);
      if (std::any_of(workers_.begin(), workers_.end(),
                      [&](const Entry& e) { return e.view.address == address; })) {
        continue;  // registered again since
      }
    }
    metrics_->RemoveCallbackGauges(WorkerLabel(address));
  }
}

bool WorkerRegistry::Drain(const std::string& address) {
  absl::MutexLock lock(&mu_);
  bool known = false;
  for (Entry& e : workers_) {
    if (e.view.address == address) e.view.draining = known = true;
  }
  return known;
}

void WorkerRegistry::ReportFailure(const std::string& address) {
  absl::MutexLock lock(&mu_);
  for (Entry& e : workers_) {
    if (e.view.address == address) {
      e.view.healthy = false;
      e.misses = max_misses_;
    }
  }
}

void WorkerRegistry::PollAll() {
  std::vector<std::string> addresses;
  bool refresh_all_info;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : workers_) addresses.push_back(e.view.address);
    refresh_all_info = polls_++ % 10 == 0;
  }
  Poll(addresses, refresh_all_info);
}

void WorkerRegistry::Poll(const std::vector<std::string>& addresses, bool refresh_all_info) {
  struct Probe {
    std::string address;
    std::shared_ptr<v1::Worker::Stub> stub;
    bool want_info = false;
    grpc::ClientContext load_context, info_context;
    v1::GetLoadRequest load_request;
    v1::InfoRequest info_request;
    v1::LoadReport load;
    v1::InfoResponse info;
    grpc::Status load_status, info_status;
  };
  std::vector<std::unique_ptr<Probe>> probes;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : workers_) {
      if (std::find(addresses.begin(), addresses.end(), e.view.address) == addresses.end()) {
        continue;
      }
      auto p = std::make_unique<Probe>();
      p->address = e.view.address;
      p->stub = e.view.stub;
      // A worker coming back may be another process (restarted with other flags).
      p->want_info = refresh_all_info || e.refresh_info || !e.view.healthy;
      probes.push_back(std::move(p));
    }
  }
  // Every call at once, each with its deadline: one worker that does not answer delays none
  // of the others (nor a worker registering, which waits for its own poll).
  int calls = 0;
  for (const auto& p : probes) calls += p->want_info ? 2 : 1;
  absl::Mutex done_mu;
  int pending = calls;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(1);
  for (const auto& p : probes) {
    Probe* probe = p.get();
    const auto finish = [&done_mu, &pending](grpc::Status* out, grpc::Status st) {
      absl::MutexLock lock(&done_mu);
      *out = std::move(st);
      --pending;
    };
    probe->load_context.set_deadline(deadline);
    Attach(&probe->load_context);
    probe->stub->async()->GetLoad(
        &probe->load_context, &probe->load_request, &probe->load,
        [probe, finish](grpc::Status st) { finish(&probe->load_status, std::move(st)); });
    if (probe->want_info) {
      probe->info_context.set_deadline(deadline);
      Attach(&probe->info_context);
      probe->stub->async()->Info(
          &probe->info_context, &probe->info_request, &probe->info,
          [probe, finish](grpc::Status st) { finish(&probe->info_status, std::move(st)); });
    }
  }
  {
    absl::MutexLock lock(&done_mu);
    done_mu.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &pending));
  }
  std::vector<std::function<void()>> down;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& p : probes) {
      for (Entry& e : workers_) {
        if (e.view.address != p->address) continue;
        if (p->load_status.ok()) {
          // Back after being marked down: a restart, likely (one drained for it serves again).
          if (e.misses >= max_misses_) e.view.draining = false;
          e.misses = 0;
          e.down_logged = false;
          e.down_code.clear();
          e.down_since = absl::InfiniteFuture();
          e.view.healthy = true;
          e.view.load = p->load;
          if (p->want_info && p->info_status.ok()) {
            e.view.info = p->info;
            e.refresh_info = false;
          }
        } else if (++e.misses >= max_misses_) {
          // (A server that is no worker, e.g. a coordinator's port, says UNIMPLEMENTED with
          // no message: the warning read "does not answer ()".)
          const grpc::Status& st = p->load_status;
          const bool no_worker = st.error_code() == grpc::StatusCode::UNIMPLEMENTED;
          e.down_code = absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code()));
          if (!e.down_logged) {  // once, also after ReportFailure marked it down
            e.down_logged = true;
            RECALL_LOG(WARNING)
                << "worker " << p->address << " does not answer ("
                << (no_worker ? "UNIMPLEMENTED: no recall.v1.Worker service there; is it a "
                                "recall-worker's --listen address?"
                    : st.error_message().empty()
                        ? absl::StrCat("gRPC status ", static_cast<int>(st.error_code()))
                        : st.error_message())
                << "): no turn goes to it until it does"
                << (no_worker ? "" : " (one loading its model answers once it has)");
          }
          e.view.healthy = false;
          e.refresh_info = true;
          e.down_since = std::min(e.down_since, absl::Now());
          for (const auto& [id, w] : watchers_) {
            if (w.address == p->address) down.push_back(w.on_down);
          }
        }
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    SettleConflicts();
  }
  for (const std::function<void()>& f : down) f();
  std::vector<std::string> forgotten;
  {
    absl::MutexLock lock(&mu_);
    std::erase_if(workers_, [&](const Entry& e) {
      const bool forget = e.registered && absl::Now() - e.down_since >= forget_after_;
      if (forget) {
        RECALL_LOG(WARNING) << "worker " << e.view.address
                            << " registered itself and has been down for "
                            << absl::FormatDuration(forget_after_) << ": forgotten";
        forgotten.push_back(e.view.address);
      }
      return forget;
    });
  }
  // Its series go too: a worker replaced by one at another address (a pod's new IP) stayed
  // listed at 0 for the coordinator's lifetime.
  if (!forgotten.empty()) ForgetSeries(forgotten);
}

std::string ServedModelsSuffix(const std::vector<std::string>& served) {
  std::vector<std::string> quoted;
  for (const std::string& name : served) quoted.push_back(absl::StrCat("\"", name, "\""));
  return quoted.empty() ? "" : absl::StrCat("; served: ", absl::StrJoin(quoted, ", "));
}

absl::Status WorkerRegistry::SessionModelNotServed(const std::string& model,
                                                   const std::vector<std::string>& served) const {
  const std::string known = ServedModelsSuffix(served);
  if (Settling()) {
    return absl::UnavailableError(absl::StrCat(
        "model: no worker serving \"", model, "\" (the session's model) has registered yet", known,
        " (the coordinator started ", absl::ToInt64Seconds(absl::Now() - started_),
        " s ago; workers register again within seconds of its restart); retryable"));
  }
  return absl::NotFoundError(absl::StrCat("model: no registered worker serves \"", model,
                                          "\" (the session's model)", known, " (not retryable)"));
}

void WorkerRegistry::SettleConflicts() {
  const auto shape = [](const v1::InfoResponse& i) {
    return absl::StrCat("context ", i.context_length(), ", vocabulary ", i.vocab_size(),
                        ", chat format ", i.chat_format());
  };
  struct Served {
    int workers = 0;
    size_t first = 0;  // the index of the first worker serving it
    std::string address;
  };
  std::map<std::string, std::map<std::string, Served>> by_name;  // name -> shape -> served
  for (size_t i = 0; i < workers_.size(); ++i) {
    const v1::InfoResponse& info = workers_[i].view.info;
    if (info.model().empty()) continue;
    Served& s = by_name[info.model()][shape(info)];
    if (s.workers++ == 0) {
      s.first = i;
      s.address = workers_[i].view.address;
    }
  }
  for (Entry& e : workers_) {
    const v1::InfoResponse& info = e.view.info;
    if (info.model().empty()) continue;
    const std::map<std::string, Served>& shapes = by_name[info.model()];
    auto used = shapes.begin();
    for (auto it = shapes.begin(); it != shapes.end(); ++it) {
      if (it->second.workers > used->second.workers ||
          (it->second.workers == used->second.workers && it->second.first < used->second.first)) {
        used = it;
      }
    }
    // One process under two addresses (localhost:P beside 127.0.0.1:P): its load counted
    // twice, a session failed over from it to itself. The first listed is used.
    const Entry* same = nullptr;
    for (const Entry& o : workers_) {
      if (&o == &e) break;
      if (!info.instance().empty() && o.view.info.instance() == info.instance()) same = &o;
    }
    const bool conflict = used->first != shape(info) || same != nullptr;
    e.conflict_reason =
        same != nullptr ? absl::StrCat("it is the worker at ", same->view.address,
                                       " (the same process under another address); list it once")
        : conflict
            ? absl::StrCat("it serves \"", info.model(), "\" as ", shape(info), ", but ",
                           used->second.workers, " worker(s) serve it as ", used->first, " (",
                           used->second.address, used->second.workers > 1 ? " and others" : "",
                           "); give it another --served-model-name")
            : "";
    if (conflict && !e.conflict) {
      RECALL_LOG(ERROR) << "worker " << e.view.address << " not used: " << e.conflict_reason;
    } else if (!conflict && e.conflict) {
      RECALL_LOG(WARNING) << "worker " << e.view.address << " serves \"" << info.model()
                          << "\" as most of its workers do now: used";
    }
    e.conflict = conflict;
  }
  std::map<std::string, const Entry*> first;  // name -> the first worker used for it
  for (Entry& e : workers_) {
    const v1::InfoResponse& info = e.view.info;
    if (info.model().empty() || e.conflict) continue;
    const Entry* ref = first.emplace(info.model(), &e).first->second;
    // The KV type may differ (a session naming none takes its worker's, wherever it runs).
    v1::CacheSettings mine = info.default_cache(), theirs = ref->view.info.default_cache();
    mine.clear_kv_dtype();
    theirs.clear_kv_dtype();
    const bool differ = !google::protobuf::util::MessageDifferencer::Equals(mine, theirs);
    if (differ && !e.defaults_differ) {
      RECALL_LOG(WARNING) << "worker " << e.view.address << "'s session defaults ("
                          << mine.ShortDebugString() << ") differ from those of "
                          << ref->view.address << " (" << theirs.ShortDebugString()
                          << "), which serves \"" << info.model()
                          << "\" too: a new session takes the defaults of the worker that checks "
                             "it (the first answering one, in --workers order) and keeps them "
                             "wherever it runs; give every worker of a model the same session "
                             "flags (--policy, --budget, --window, --alpha, ...)";
    }
    e.defaults_differ = differ;
    const std::string& weights = info.weights();
    const std::string& ref_weights = ref->view.info.weights();
    const bool weights_differ = !weights.empty() && !ref_weights.empty() && weights != ref_weights;
    if (weights_differ && !e.weights_differ) {
      RECALL_LOG(WARNING) << "worker " << e.view.address << " serves \"" << info.model()
                          << "\" with " << weights << " weights, " << ref->view.address << " with "
                          << ref_weights
                          << ": a session's replies change when it fails over between them; "
                             "give every worker of a model the same --weight-dtype (or another "
                             "--served-model-name)";
    }
    e.weights_differ = weights_differ;
  }
}

uint64_t WorkerRegistry::Watch(const std::string& address, std::function<void()> on_down) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_watch_++;
  watchers_[id] = {address, std::move(on_down)};
  return id;
}

void WorkerRegistry::Unwatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(id);
}

void WorkerRegistry::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), heartbeat_);
      if (stop_) return;
    }
    PollAll();
    DeliverDrops();
  }
}

void WorkerRegistry::DropLater(const std::string& address, const std::string& id) {
  if (address.empty()) return;
  absl::MutexLock lock(&mu_);
  if (pending_count_ >= kMaxPendingDrops) return;
  auto [it, added] = pending_drops_.try_emplace(address);
  if (added) it->second.since = absl::Now();
  if (it->second.ids.insert(id).second) ++pending_count_;
}

void WorkerRegistry::KeepSession(const std::string& address, const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = pending_drops_.find(address);
  if (it == pending_drops_.end() || it->second.ids.erase(id) == 0) return;
  --pending_count_;
  if (it->second.ids.empty()) pending_drops_.erase(it);
}

void WorkerRegistry::DropEverywhere(const std::string& id) {
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : workers_) addresses.push_back(e.view.address);
  }
  for (const std::string& a : addresses) DropLater(a, id);
}

size_t WorkerRegistry::PendingDrops() const {
  absl::MutexLock lock(&mu_);
  return pending_count_;
}

void WorkerRegistry::DeliverDrops() {
  struct Due {
    std::shared_ptr<v1::Worker::Stub> stub;
    std::string id;
  };
  std::vector<Due> due;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_drops_.begin(); it != pending_drops_.end();) {
      const auto known = std::find_if(workers_.begin(), workers_.end(),
                                      [&](const Entry& e) { return e.view.address == it->first; });
      const bool up = known != workers_.end() && known->view.healthy;
      // Up: sent now (kDropsPerHeartbeat at most). Not known for forget_after (gone for
      // good): let go. Else kept.
      if (up) {
        std::set<std::string>& ids = it->second.ids;
        while (!ids.empty() && due.size() < kDropsPerHeartbeat) {
          due.push_back({known->view.stub, *ids.begin()});
          ids.erase(ids.begin());
          --pending_count_;
        }
      } else if (known == workers_.end() && absl::Now() - it->second.since >= forget_after_) {
        pending_count_ -= it->second.ids.size();
        it->second.ids.clear();
      }
      it = it->second.ids.empty() ? pending_drops_.erase(it) : std::next(it);
    }
  }
  // Sent without waiting (the heartbeat thread polls every worker on time), each only while
  // the session is idle there (if_idle): a turn that came back to that worker since keeps it.
  for (Due& d : due) {
    struct Call {
      grpc::ClientContext context;
      v1::DropSessionRequest request;
      v1::DropSessionResponse response;
    };
    auto call = std::make_shared<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    Attach(&call->context);
    call->request.set_session_id(d.id);
    call->request.set_if_idle(true);
    d.stub->async()->DropSession(&call->context, &call->request, &call->response,
                                 [call, stub = d.stub](grpc::Status) {});
  }
}

std::vector<WorkerView> WorkerRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerView> out;
  for (const Entry& e : workers_) {
    if (!e.conflict) out.push_back(e.view);
  }
  return out;
}

std::string WorkerRegistry::NotUsedReason(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const Entry& e : workers_) {
    if (e.view.address != address) continue;
    if (!e.conflict_reason.empty() || e.view.healthy || e.down_code.empty()) {
      return e.conflict_reason;
    }
    return absl::StrCat("the coordinator's heartbeats to ", address, " fail (", e.down_code,
                        "): is --advertise an address the coordinator can reach?");
  }
  return "";
}

std::shared_ptr<v1::Worker::Stub> WorkerRegistry::Stub(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const Entry& e : workers_) {
    if (e.view.address == address) return e.view.stub;
  }
  return nullptr;
}

void WorkerRegistry::DropSession(const std::string& address, const std::string& id) const {
  std::shared_ptr<v1::Worker::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : workers_) {
      if (e.view.address == address && e.view.healthy) stub = e.view.stub;
    }
  }
  if (stub == nullptr) return;  // unknown or down: nothing to wait 2 s for
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  Attach(&ctx);
  v1::DropSessionRequest drop;
  drop.set_session_id(id);
  v1::DropSessionResponse ignored;
  stub->DropSession(&ctx, drop, &ignored);
}

}  // namespace recall::coordinator
