#include "coordinator/worker_registry.h"

#include <chrono>

namespace recall::coordinator {

WorkerRegistry::WorkerRegistry(metrics::Registry* metrics, absl::Duration heartbeat, int max_misses,
                               grpcutil::ClusterCredential cluster)
    : metrics_(metrics),
      heartbeat_(heartbeat),
      max_misses_(max_misses),
      cluster_(std::move(cluster)),
      thread_([this] { Loop(); }) {}

WorkerRegistry::~WorkerRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void WorkerRegistry::Add(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : workers_) {
      if (e.view.address == address) return;
    }
    Entry e;
    e.view.address = address;
    e.view.stub = v1::Worker::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    workers_.push_back(std::move(e));
  }
  if (metrics_ != nullptr) {
    const std::string label = "worker=\"" + address + "\"";
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
    gauge("recall_coordinator_worker_sessions", "Session caches the worker holds",
          [](const WorkerView& w) {
            return w.load.resident_sessions() + w.load.offloaded_sessions();
          });
    gauge("recall_coordinator_worker_kv_blocks_free", "Free KV blocks on the worker",
          [](const WorkerView& w) { return w.load.kv_blocks_free(); });
    gauge("recall_coordinator_worker_turns", "Active + queued turns on the worker",
          [](const WorkerView& w) { return w.load.active_turns() + w.load.queued_turns(); });
  }
  PollAll();
}

void WorkerRegistry::Drain(const std::string& address) {
  absl::MutexLock lock(&mu_);
  for (Entry& e : workers_) {
    if (e.view.address == address) e.view.draining = true;
  }
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
  std::vector<std::pair<std::string, std::shared_ptr<v1::Worker::Stub>>> targets;
  {
    absl::MutexLock lock(&mu_);
    for (const Entry& e : workers_) targets.emplace_back(e.view.address, e.view.stub);
  }
  for (auto& [address, stub] : targets) {
    v1::LoadReport load;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    Attach(&ctx);
    const bool ok = stub->GetLoad(&ctx, v1::GetLoadRequest(), &load).ok();
    v1::InfoResponse info;
    bool need_info;
    {
      absl::MutexLock lock(&mu_);
      need_info = false;
      for (const Entry& e : workers_) {
        if (e.view.address == address) need_info = e.view.info.model().empty();
      }
    }
    if (ok && need_info) {
      grpc::ClientContext ictx;
      ictx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      Attach(&ictx);
      stub->Info(&ictx, v1::InfoRequest(), &info);
    }
    absl::MutexLock lock(&mu_);
    for (Entry& e : workers_) {
      if (e.view.address != address) continue;
      if (ok) {
        e.misses = 0;
        e.view.healthy = true;
        e.view.load = load;
        if (need_info) e.view.info = info;
      } else if (++e.misses >= max_misses_) {
        e.view.healthy = false;
      }
    }
  }
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
  }
}

std::vector<WorkerView> WorkerRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerView> out;
  for (const Entry& e : workers_) out.push_back(e.view);
  return out;
}

std::shared_ptr<v1::Worker::Stub> WorkerRegistry::Stub(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const Entry& e : workers_) {
    if (e.view.address == address) return e.view.stub;
  }
  return nullptr;
}

}  // namespace recall::coordinator
