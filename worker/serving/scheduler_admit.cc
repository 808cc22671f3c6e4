// Scheduler: admission. The blocks a turn needs, whether it can ever fit, making room for it
// (memory_ chooses what to offload or drop), preempting a running turn, and making or
// restoring a session's cache when its turn is admitted.
#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/runtime/positions.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/scheduler_turn.h"

namespace recall::serving {

Scheduler::RankBlocks Scheduler::BlocksToAdmit(const Turn& t) const {
  const Session* s = t.session;
  // The rest of the prompt (prefill does not evict; a replay's give-backs do, after their
  // tokens were held) plus the first generated token, in every layer; an offloaded cache
  // counts the blocks its restore takes.
  int remaining = t.PromptToHold() + 1;
  // A compact session's cache never holds more than the context (PlanFeed).
  if (s->positions == runtime::Positions::kCompact) {
    remaining = std::min(remaining, model_.config.max_seq_len);
  }
  RankBlocks need(ranks_.ranks.size());
  for (size_t r = 0; r < need.size(); ++r) {
    if (!s->caches.empty()) {
      need[r] = s->caches[r]->BlocksNeededFor(remaining);
    } else {
      const kernels::PagedKvLayout& layout = ranks_.ranks[r].pool->layout();
      const int64_t bt = layout.block_tokens;
      need[r] = layout.n_layers * ((remaining + bt - 1) / bt);
    }
  }
  return need;
}

absl::Status Scheduler::CheckPeakFits(const Turn& t) const {
  const Session* s = t.session;
  if (!s->evictors.empty() || s->episodic != nullptr) return absl::OkStatus();  // bounded
  if (s->cache() == nullptr) {  // no cache yet: will the settings make an evicting one?
    absl::StatusOr<SessionCacheSpec> spec =
        caches_.Resolve(t.req.cache, std::hash<std::string>()(s->id));
    if (!spec.ok() || spec->evictor.has_value()) return absl::OkStatus();  // reported later
  }
  const int cached = s->cache() != nullptr ? s->max_length() : 0;
  const int prompt = t.PromptToHold();
  const int generate = std::max(0, t.req.max_tokens - t.n_resume);
  const int64_t tokens =
      std::min<int64_t>(int64_t{cached} + prompt + generate, model_.config.max_seq_len);
  for (const SchedulerRank& r : ranks_.ranks) {
    const kernels::PagedKvLayout& layout = r.pool->layout();
    const int64_t bt = layout.block_tokens;
    const int64_t need = layout.n_layers * ((tokens + bt - 1) / bt);
    if (need > r.pool->num_blocks()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the turn may need ", need, " KV blocks (", cached, " cached + ", prompt, " prompt + ",
          generate, " sampling.max_tokens tokens in ", layout.n_layers,
          " layers) but the whole pool has ", r.pool->num_blocks(),
          ": lower sampling.max_tokens, choose an evicting cache policy or give the worker more "
          "--kv-cache-bytes (not retryable)"));
    }
  }
  return absl::OkStatus();
}

bool Scheduler::MakeRoom(const RankBlocks& need, const Session* keep) {
  if (memory_.Fits(need)) return true;
  std::set<const Session*> running;
  for (const auto& t : active_) running.insert(t->session);
  return memory_.MakeRoom(need, keep, running);
}

bool Scheduler::PreemptOne() {
  if (active_.size() <= 1) return false;
  auto newest = std::max_element(active_.begin(), active_.end(), [](const auto& a, const auto& b) {
    return a->admitted_at < b->admitted_at;
  });
  std::shared_ptr<Turn> t = *newest;
  active_.erase(newest);
  Session& s = *t->session;
  memory_.OffloadPinned(s);  // idle ones dropped for it, else past the host budget: it resumes
  metrics_->preemptions->Increment();
  RECALL_LOG(INFO) << "preempted turn " << t->req.request_id << " of session " << s.id
                   << " to host memory (" << s.host_bytes() << " bytes)";
  waiting_.push_front(std::move(t));
  return true;
}

absl::Status Scheduler::CreateCache(Session& s, const Turn& t) {
  RECALL_ASSIGN_OR_RETURN(SessionCacheSpec spec,
                          caches_.Resolve(t.req.cache, std::hash<std::string>()(s.id)));
  for (const SchedulerRank& r : ranks_.ranks) {
    s.caches.push_back(std::make_unique<cache::SequenceCache>(r.pool));
  }
  s.positions = spec.positions;
  if (!spec.evictor.has_value()) return absl::OkStatus();  // full
  if (spec.policy == "episodic") {
    s.episodic = std::make_unique<SessionEpisodes>();
    s.episodic->spec = spec;
    absl::Status ready = episodes_.Start();
    absl::StatusOr<std::unique_ptr<cache::eviction::SessionEvictor>> evictor =
        ready.ok() ? cache::eviction::SessionEvictor::Create(episodes_.EvictorOptions(s),
                                                             s.caches[0].get())
                   : absl::StatusOr<std::unique_ptr<cache::eviction::SessionEvictor>>(ready);
    if (!evictor.ok()) {
      s.caches.clear();
      s.episodic.reset();
      return evictor.status().code() == absl::StatusCode::kInvalidArgument
                 ? evictor.status()
                 : absl::InvalidArgumentError(absl::StrCat("cache: ", evictor.status().message()));
    }
    s.evictors.push_back(*std::move(evictor));
    return absl::OkStatus();
  }
  cache::eviction::SessionEvictorOptions o = *spec.evictor;
  absl::Status made;
  for (size_t r = 0; made.ok() && r < ranks_.ranks.size(); ++r) {
    const SchedulerRank& rank = ranks_.ranks[r];
    o.n_heads = rank.forward->model().config.n_heads;
    o.comm = rank.comm;
    o.backend = &rank.forward->backend();
    o.kv_head_offset = rank.kv_head_offset;
    absl::StatusOr<std::unique_ptr<cache::eviction::SessionEvictor>> evictor =
        cache::eviction::SessionEvictor::Create(o, s.caches[r].get());
    if (!evictor.ok()) {
      made = evictor.status();
      break;
    }
    s.evictors.push_back(*std::move(evictor));
  }
  if (!made.ok()) {
    s.evictors.clear();
    s.caches.clear();
    return absl::InvalidArgumentError(absl::StrCat("cache: ", made.message()));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::EnsureResident(Turn& t) {
  Session& s = *t.session;
  bool fresh = false;
  if (s.caches.empty()) {
    RECALL_RETURN_IF_ERROR(CreateCache(s, t));
    fresh = true;
  } else if (s.offloaded()) {
    if (absl::Status restored = memory_.Restore(s); !restored.ok()) {
      t.worker_failed = true;  // the worker's own failure, whatever its code
      return restored;
    }
  }
  if (t.touched) return absl::OkStatus();  // resuming after preemption
  s.last_turn.reset();                     // a later turn: the last can no longer be taken back
  t.fed_before = s.tokens_fed;
  t.pending_before = std::move(s.pending);  // Prepare moved them into the prompt
  t.reply_tail_before = std::move(s.reply_tail);
  s.pending.clear();
  s.reply_tail.clear();
  cache::eviction::SessionEvictor* evictor = s.evictor();
  if (evictor != nullptr) {
    t.evictions_at_start = TotalEvictions(s);
    t.evicted_at_start = TotalEvictedSlots(s);
    const model::ModelConfig& c = model_.config;
    const bool probs = evictor->policy().needs_attention() && !evictor->steps_on_backend();
    const bool window = fresh && evictor->policy().compresses_prefill();
    if (window) {
      t.window_w =
          std::min<int>(evictor->policy().options().window, static_cast<int>(t.prompt.size()));
      t.window_first = static_cast<int>(t.prompt.size()) - t.window_w;
    }
    for (const SchedulerRank& r : ranks_.ranks) {
      const int rank_heads = r.forward->model().config.n_heads;
      // Grown as the cache grows (EnsureProbs): bounded by the cache, not the context.
      if (probs) t.probs.emplace_back();
      if (window) {
        t.window_queries.emplace_back(
            static_cast<size_t>(c.n_layers) * t.window_w * rank_heads * c.head_dim, 0.0f);
      }
    }
  }
  return absl::OkStatus();
}

int64_t Scheduler::TotalEvictions(const Session& s) {
  int64_t n = 0;
  for (const auto& e : s.evictors) n += e->evictions();
  return n;
}

int64_t Scheduler::TotalEvictedSlots(const Session& s) {
  int64_t n = 0;
  for (const auto& e : s.evictors) n += e->evicted_slots();
  return n;
}

}  // namespace recall::serving
