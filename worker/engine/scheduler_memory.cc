// Scheduler: KV memory admission. Offloading idle sessions to host memory, dropping them
// when the host budget is spent, preempting running turns, and creating session caches.
#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/scheduler_turn.h"

namespace recall::engine {

int64_t Scheduler::BlocksToAdmit(const Turn& t) const {
  const Session* s = t.session;
  // The rest of the prompt (prefill does not evict) plus the first generated token, in every
  // layer; an offloaded cache counts the blocks its restore takes.
  const int remaining = static_cast<int>(t.prompt.size() - t.fed) + 1;
  if (s->cache != nullptr) return s->cache->BlocksNeededFor(remaining);
  const int64_t bt = pool_.layout().block_tokens;
  return pool_.layout().n_layers * ((remaining + bt - 1) / bt);
}

bool Scheduler::MakeRoom(int64_t blocks, const Session* keep) {
  while (pool_.free_blocks() < blocks) {
    Session* victim = nullptr;
    for (auto& [id, s] : sessions_) {
      if (s.get() == keep || s->busy || !s->resident() || s->cache->num_blocks() == 0) continue;
      if (victim == nullptr || s->last_used < victim->last_used) victim = s.get();
    }
    if (victim == nullptr) return false;
    OffloadOrDrop(*victim);
  }
  return true;
}

bool Scheduler::PreemptOne() {
  if (active_.size() <= 1) return false;
  auto newest = std::max_element(active_.begin(), active_.end(), [](const auto& a, const auto& b) {
    return a->admitted_at < b->admitted_at;
  });
  std::shared_ptr<Turn> t = *newest;
  active_.erase(newest);
  Session& s = *t->session;
  s.cache->OffloadToHost();  // kept even past the host budget: the turn must resume
  host_bytes_ += s.cache->host_bytes();
  metrics_->preemptions->Increment();
  RECALL_LOG(INFO) << "preempted turn " << t->req.request_id << " of session " << s.id
                   << " to host memory (" << s.cache->host_bytes() << " bytes)";
  waiting_.push_front(std::move(t));
  return true;
}

void Scheduler::OffloadOrDrop(Session& s) {
  if (host_bytes_ + s.cache->bytes_held() <= options_.host_cache_bytes) {
    s.cache->OffloadToHost();
    host_bytes_ += s.cache->host_bytes();
    metrics_->offloads->Increment();
    return;
  }
  metrics_->drops_memory->Increment();
  DropCache(s);
}

void Scheduler::DropCache(Session& s) {
  if (s.offloaded()) host_bytes_ -= s.cache->host_bytes();
  sessions_.erase(s.id);  // destroys the evictor, then the cache (its blocks go back)
}

absl::Status Scheduler::CreateCache(Session& s, const Turn& t) {
  s.cache = std::make_unique<cache::SequenceCache>(&pool_);
  const CacheRequest& c = t.req.cache;
  const std::string policy = c.policy.value_or(options_.default_policy);
  if (policy == "full") return absl::OkStatus();
  cache::eviction::SessionEvictorOptions o;
  o.policy.name = policy;
  o.policy.window = c.window.value_or(options_.default_window);
  o.policy.alpha = static_cast<float>(c.alpha.value_or(options_.default_alpha));
  if (c.budget_fraction.has_value() ||
      (!c.budget_tokens.has_value() && options_.default_budget_fraction.has_value())) {
    o.budget.unit = cache::eviction::BudgetOptions::Unit::kFraction;
    o.budget.budget = c.budget_fraction.value_or(options_.default_budget_fraction.value_or(1));
  } else {
    o.budget.budget = c.budget_tokens.value_or(options_.default_budget_tokens);
  }
  o.n_heads = model_.config.n_heads;
  o.session = std::hash<std::string>()(s.id);
  absl::StatusOr<std::unique_ptr<cache::eviction::SessionEvictor>> evictor =
      cache::eviction::SessionEvictor::Create(o, s.cache.get());
  if (!evictor.ok()) {
    s.cache.reset();
    return absl::InvalidArgumentError(absl::StrCat("cache: ", evictor.status().message()));
  }
  s.evictor = *std::move(evictor);
  return absl::OkStatus();
}

absl::Status Scheduler::EnsureResident(Turn& t) {
  Session& s = *t.session;
  bool fresh = false;
  if (s.cache == nullptr) {
    RECALL_RETURN_IF_ERROR(CreateCache(s, t));
    fresh = true;
  } else if (s.offloaded()) {
    const int64_t host = s.cache->host_bytes();
    RECALL_RETURN_IF_ERROR(s.cache->RestoreFromHost());
    host_bytes_ -= host;
    metrics_->restores->Increment();
  }
  if (t.touched) return absl::OkStatus();  // resuming after preemption
  s.pending.clear();  // Prepare moved them into the prompt
  if (s.evictor != nullptr) {
    t.evictions_at_start = s.evictor->evictions();
    t.evicted_at_start = s.evictor->evicted_slots();
    const model::ModelConfig& c = model_.config;
    if (s.evictor->policy().needs_attention()) {
      t.probs.assign(static_cast<size_t>(c.n_layers) * c.n_heads * c.max_seq_len, 0.0f);
    }
    if (fresh && s.evictor->policy().compresses_prefill()) {
      t.window_w = std::min<int>(s.evictor->policy().options().window,
                                 static_cast<int>(t.prompt.size()));
      t.window_first = static_cast<int>(t.prompt.size()) - t.window_w;
      t.window_queries.assign(
          static_cast<size_t>(c.n_layers) * t.window_w * c.n_heads * c.head_dim, 0.0f);
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::engine
