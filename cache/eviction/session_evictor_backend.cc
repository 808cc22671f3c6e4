// SessionEvictor: stepping LazyEviction on the backend (SessionEvictorOptions::backend).
//
// The backend state mirrors states_' ts and mri, one row per (layer, KV head), in the
// backend's memory. A step appends and observes there (Backend::LazyObserve); the host copy
// goes stale. An eviction step (some head over its budget at t % W == 0) selects and compacts
// there as well (Backend::LazyEvict, the host path's choice); only the keep lists cross to
// the host, for the cache's positions. The host copy is brought up to date on demand
// (SyncStates) or when the backend state grows.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cache/eviction/session_evictor.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::cache::eviction {

absl::Status SessionEvictor::SyncStates() {
  if (!on_backend_) return absl::OkStatus();
  PullStates();
  return options_.backend->Health();
}

absl::Status SessionEvictor::EnsureBackendState(int max_len) {
  const size_t rows = static_cast<size_t>(n_layers_) * n_kv_heads_;
  if (backend_lens_.size() != rows) backend_lens_.assign(rows, 0);
  if (backend_state_.get() != nullptr && max_len <= state_cap_) return absl::OkStatus();
  PullStates();  // the host copy carries the contents over
  int cap = std::max(state_cap_, 64);
  while (cap < max_len) cap *= 2;
  kernels::Memory& memory = options_.backend->memory();
  backend_state_ = kernels::Buffer();
  absl::StatusOr<kernels::Buffer> b =
      kernels::Buffer::Allocate(memory, 2 * rows * static_cast<size_t>(cap) * sizeof(int32_t));
  if (!b.ok()) {
    state_cap_ = 0;
    return absl::ResourceExhaustedError(absl::StrCat(
        "session evictor: no backend memory for the lazy state of ", cap, " slots per head: ",
        b.status().message()));
  }
  backend_state_ = std::move(*b);
  state_cap_ = cap;
  PushStates();
  return absl::OkStatus();
}

void SessionEvictor::PullStates() {
  if (!host_stale_ || backend_state_.get() == nullptr) return;
  const size_t rows = backend_lens_.size();
  const size_t cap = static_cast<size_t>(state_cap_);
  const int width = *std::max_element(backend_lens_.begin(), backend_lens_.end());
  image_.resize(2 * rows * static_cast<size_t>(width));
  if (width > 0) {
    // ts and mri planes are adjacent: 2 * rows rows of `width` slots, one copy.
    options_.backend->memory().CopyOutRows(image_.data(), width * sizeof(int32_t),
                                           backend_state_.get(), cap * sizeof(int32_t),
                                           width * sizeof(int32_t), 2 * rows);
  }
  for (size_t r = 0; r < rows; ++r) {
    HeadState& s = states_[r];
    const size_t len = static_cast<size_t>(backend_lens_[r]);
    const int32_t* ts = image_.data() + r * width;
    const int32_t* mri = image_.data() + (rows + r) * width;
    s.ts.assign(ts, ts + len);
    s.mri.assign(mri, mri + len);
    s.score.assign(len, 0.0f);  // lazy does not use it; kept the same size as ts
  }
  host_stale_ = false;
}

void SessionEvictor::PushStates() {
  const size_t rows = backend_lens_.size();
  const size_t cap = static_cast<size_t>(state_cap_);
  image_.assign(2 * rows * cap, 0);
  for (size_t r = 0; r < rows; ++r) {
    const HeadState& s = states_[r];
    RECALL_CHECK(s.size() <= state_cap_) << "lazy state larger than the backend state";
    std::copy(s.ts.begin(), s.ts.end(), image_.begin() + r * cap);
    std::copy(s.mri.begin(), s.mri.end(), image_.begin() + (rows + r) * cap);
    backend_lens_[r] = s.size();
  }
  options_.backend->memory().CopyIn(backend_state_.get(), image_.data(),
                                    image_.size() * sizeof(int32_t));
  host_stale_ = false;
}

absl::Status SessionEvictor::EnsureKeepLists(int widest) {
  const size_t bytes = backend_lens_.size() * static_cast<size_t>(widest) * sizeof(int32_t);
  if (backend_keeps_.bytes() >= bytes) return absl::OkStatus();
  backend_keeps_ = kernels::Buffer();
  absl::StatusOr<kernels::Buffer> b = kernels::Buffer::Allocate(options_.backend->memory(), bytes);
  if (!b.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session evictor: no backend memory for the keep lists of ", backend_lens_.size(),
        " heads of ", widest, " slots: ", b.status().message()));
  }
  backend_keeps_ = std::move(*b);
  return absl::OkStatus();
}

absl::Status SessionEvictor::StepOnBackend(const float* probs, int64_t stride) {
  RECALL_RETURN_IF_ERROR(AgreeOnStep());
  const int max_len = cache_->max_length();
  RECALL_RETURN_IF_ERROR(EnsureBackendState(max_len));
  // Budgets first, so the keep lists an eviction step needs are had before the step changes
  // anything.
  allocator_.Allocate(FractionLength(), budgets_.data());
  const int widest = *std::max_element(budgets_.begin(), budgets_.end());
  if (max_len > *std::min_element(budgets_.begin(), budgets_.end())) {
    RECALL_RETURN_IF_ERROR(EnsureKeepLists(widest));
  }
  const int t = ++step_;
  peak_bytes_ = std::max(peak_bytes_, cache_->bytes_held());

  lens_now_.resize(backend_lens_.size());
  bool any_evict = false;
  for (int l = 0; l < n_layers_; ++l) {
    const int32_t* lengths = cache_->lengths(l);
    for (int h = 0; h < n_kv_heads_; ++h) {
      const size_t r = static_cast<size_t>(l) * n_kv_heads_ + h;
      RECALL_CHECK(backend_lens_[r] <= lengths[h])
          << "cache (" << l << ", " << h << ") was compacted outside the evictor";
      lens_now_[r] = lengths[h];
      any_evict |= policy_->ShouldEvict(lengths[h], budgets_[static_cast<size_t>(l)], t);
    }
  }
  kernels::LazyObserveArgs a;
  a.probs = probs;
  a.probs_stride = stride;
  a.n_layers = n_layers_;
  a.n_heads = options_.n_heads;
  a.n_kv_heads = n_kv_heads_;
  a.ts = backend_state_.as<int32_t>();
  a.mri = a.ts + backend_lens_.size() * static_cast<size_t>(state_cap_);
  a.state_stride = state_cap_;
  a.old_lens = backend_lens_.data();
  a.lens = lens_now_.data();
  a.alpha = options_.policy.alpha;
  a.t = t;
  options_.backend->LazyObserve(a);
  backend_lens_.swap(lens_now_);
  host_stale_ = true;
  RECALL_RETURN_IF_ERROR(options_.backend->Health());
  if (any_evict) RECALL_RETURN_IF_ERROR(EvictOnBackend(t));
  return VerifyStep(t);
}

absl::Status SessionEvictor::EvictOnBackend(int t) {
  evict_rows_.clear();
  evict_lens_.clear();
  evict_keeps_.clear();
  int widest = 0;
  for (int l = 0; l < n_layers_; ++l) {
    const int budget = budgets_[static_cast<size_t>(l)];
    for (int h = 0; h < n_kv_heads_; ++h) {
      const int r = l * n_kv_heads_ + h;
      const int len = backend_lens_[static_cast<size_t>(r)];
      if (!policy_->ShouldEvict(len, budget, t)) continue;
      evict_rows_.push_back(r);
      evict_lens_.push_back(len);
      evict_keeps_.push_back(budget);
      widest = std::max(widest, budget);
    }
  }
  const size_t rows = backend_lens_.size();
  const size_t cap = static_cast<size_t>(state_cap_);
  RECALL_CHECK(backend_keeps_.bytes() >= rows * static_cast<size_t>(widest) * sizeof(int32_t))
      << "keep lists not sized for budget " << widest;
  kernels::LazyEvictArgs e;
  e.kv = cache_->View();
  e.ts = backend_state_.as<int32_t>();
  e.mri = e.ts + rows * cap;
  e.state_stride = state_cap_;
  e.n_rows = static_cast<int>(evict_rows_.size());
  e.rows = evict_rows_.data();
  e.lens = evict_lens_.data();
  e.keeps = evict_keeps_.data();
  e.window = options_.policy.window;
  e.t = t;
  e.keep_out = backend_keeps_.as<int32_t>();
  e.keep_stride = widest;
  options_.backend->LazyEvict(e);
  image_.resize(evict_rows_.size() * static_cast<size_t>(widest));
  options_.backend->memory().CopyOut(image_.data(), e.keep_out, image_.size() * sizeof(int32_t));
  RECALL_RETURN_IF_ERROR(options_.backend->Health());
  for (size_t i = 0; i < evict_rows_.size(); ++i) {
    const int r = evict_rows_[i], l = r / n_kv_heads_, h = r % n_kv_heads_;
    const int32_t* keep = image_.data() + i * static_cast<size_t>(widest);
    keep_.assign(keep, keep + evict_keeps_[i]);
    DigestKeep(l, h);
    cache_->CompactMoved(l, h, keep_.data(), evict_keeps_[i]);
    CountEviction(l, h, evict_lens_[i], evict_keeps_[i]);
    backend_lens_[static_cast<size_t>(r)] = evict_keeps_[i];
  }
  cache_->TrimBlocks();
  return absl::OkStatus();
}

}  // namespace recall::cache::eviction
