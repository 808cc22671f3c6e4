// SessionEvictor: stepping LazyEviction on the backend (SessionEvictorOptions::backend).
//
// The state lives in the backend's memory (LazyBackendState, lazy_backend_state.h); this
// file makes the policy's decisions around it: the step counter every rank agrees on, the
// budgets, which (layer, head) rows evict at step t, and, with the keep lists that come
// back, the cache's positions, counters and the ranks' digest.
#include <algorithm>

#include "cache/eviction/lazy_backend_state.h"
#include "cache/eviction/session_evictor.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::cache::eviction {

absl::Status SessionEvictor::SyncStates() {
  if (backend_state_ == nullptr) return absl::OkStatus();
  backend_state_->Pull(states_);
  return options_.backend->Health();
}

absl::Status SessionEvictor::StepOnBackend(const float* probs, int64_t stride) {
  RECALL_RETURN_IF_ERROR(AgreeOnStep());
  LazyBackendState& state = *backend_state_;
  const int max_len = cache_->max_length();
  RECALL_RETURN_IF_ERROR(state.Ensure(max_len, states_));
  // Budgets first, so the keep lists an eviction step needs are had before the step changes
  // anything.
  allocator_.Allocate(FractionLength(), budgets_.data());
  const int widest = *std::max_element(budgets_.begin(), budgets_.end());
  if (max_len > *std::min_element(budgets_.begin(), budgets_.end())) {
    RECALL_RETURN_IF_ERROR(state.EnsureKeepLists(widest));
  }
  const int t = ++step_;
  NotePeak();

  lens_now_.resize(static_cast<size_t>(state.rows()));
  bool any_evict = false;
  for (int l = 0; l < n_layers_; ++l) {
    const int32_t* lengths = cache_->lengths(l);
    for (int h = 0; h < n_kv_heads_; ++h) {
      const size_t r = static_cast<size_t>(l) * n_kv_heads_ + h;
      RECALL_CHECK(state.lens()[r] <= lengths[h])
          << "cache (" << l << ", " << h << ") was compacted outside the evictor";
      lens_now_[r] = lengths[h];
      any_evict |= policy_->ShouldEvict(lengths[h], budgets_[static_cast<size_t>(l)], t);
    }
  }
  RECALL_RETURN_IF_ERROR(
      state.Observe(probs, stride, options_.n_heads, lens_now_, options_.policy.alpha, t));
  if (any_evict) RECALL_RETURN_IF_ERROR(EvictOnBackend(t));
  return VerifyStep(t);
}

absl::Status SessionEvictor::EvictOnBackend(int t) {
  evict_rows_.clear();
  evict_keeps_.clear();
  const std::vector<int32_t>& lens = backend_state_->lens();
  for (int l = 0; l < n_layers_; ++l) {
    const int budget = budgets_[static_cast<size_t>(l)];
    for (int h = 0; h < n_kv_heads_; ++h) {
      const int r = l * n_kv_heads_ + h;
      if (!policy_->ShouldEvict(lens[static_cast<size_t>(r)], budget, t)) continue;
      evict_rows_.push_back(r);
      evict_keeps_.push_back(budget);
    }
  }
  RECALL_RETURN_IF_ERROR(backend_state_->Evict(
      cache_->View(), evict_rows_, evict_keeps_, options_.policy.window, t,
      [&](size_t i, const int32_t* keep, int len) {
        const int r = evict_rows_[i], l = r / n_kv_heads_, h = r % n_kv_heads_;
        keep_.assign(keep, keep + evict_keeps_[i]);
        DigestKeep(l, h);
        cache_->CompactMoved(l, h, keep_.data(), evict_keeps_[i]);
        CountEviction(l, h, len, evict_keeps_[i]);
      }));
  cache_->TrimBlocks();
  return absl::OkStatus();
}

}  // namespace recall::cache::eviction
