#include "cache/eviction/lazy_backend_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::cache::eviction {

LazyBackendState::LazyBackendState(kernels::Backend* backend, int n_layers, int n_kv_heads)
    : backend_(backend),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      lens_(static_cast<size_t>(n_layers) * n_kv_heads, 0) {}

absl::Status LazyBackendState::Ensure(int max_len, std::vector<HeadState>& host) {
  if (state_.get() != nullptr && max_len <= cap_) return absl::OkStatus();
  Pull(host);  // the host copy carries the contents over
  int cap = std::max(cap_, 64);
  while (cap < max_len) cap *= 2;
  state_ = kernels::Buffer();
  absl::StatusOr<kernels::Buffer> b = kernels::Buffer::Allocate(
      backend_->memory(), 2 * lens_.size() * static_cast<size_t>(cap) * sizeof(int32_t));
  if (!b.ok()) {
    cap_ = 0;
    return absl::ResourceExhaustedError(
        absl::StrCat("session evictor: no backend memory for the lazy state of ", cap,
                     " slots per head: ", b.status().message()));
  }
  state_ = std::move(*b);
  cap_ = cap;
  Push(host);
  return absl::OkStatus();
}

void LazyBackendState::Pull(std::vector<HeadState>& host) {
  if (!host_stale_ || state_.get() == nullptr) return;
  const size_t rows = lens_.size();
  const size_t cap = static_cast<size_t>(cap_);
  const int width = *std::max_element(lens_.begin(), lens_.end());
  image_.resize(2 * rows * static_cast<size_t>(width));
  if (width > 0) {
    // ts and mri planes are adjacent: 2 * rows rows of `width` slots, one copy.
    backend_->memory().CopyOutRows(image_.data(), width * sizeof(int32_t), state_.get(),
                                   cap * sizeof(int32_t), width * sizeof(int32_t), 2 * rows);
  }
  for (size_t r = 0; r < rows; ++r) {
    HeadState& s = host[r];
    const size_t len = static_cast<size_t>(lens_[r]);
    const int32_t* ts = image_.data() + r * width;
    const int32_t* mri = image_.data() + (rows + r) * width;
    s.ts.assign(ts, ts + len);
    s.mri.assign(mri, mri + len);
  }
  host_stale_ = false;
}

void LazyBackendState::Shrink(const std::vector<HeadState>& host) {
  RECALL_CHECK(!host_stale_) << "Shrink before Pull";
  for (size_t r = 0; r < lens_.size(); ++r) {
    RECALL_CHECK(host[r].size() <= lens_[r]) << "Shrink: row " << r << " grew";
    lens_[r] = host[r].size();
  }
}

void LazyBackendState::Push(const std::vector<HeadState>& host) {
  const size_t rows = lens_.size();
  const size_t cap = static_cast<size_t>(cap_);
  image_.assign(2 * rows * cap, 0);
  for (size_t r = 0; r < rows; ++r) {
    const HeadState& s = host[r];
    RECALL_CHECK(s.size() <= cap_) << "lazy state larger than the backend state";
    std::copy(s.ts.begin(), s.ts.end(), image_.begin() + r * cap);
    std::copy(s.mri.begin(), s.mri.end(), image_.begin() + (rows + r) * cap);
    lens_[r] = s.size();
  }
  backend_->memory().CopyIn(state_.get(), image_.data(), image_.size() * sizeof(int32_t));
  host_stale_ = false;
}

absl::Status LazyBackendState::EnsureKeepLists(int widest) {
  const size_t bytes = lens_.size() * static_cast<size_t>(widest) * sizeof(int32_t);
  if (keeps_.bytes() >= bytes) return absl::OkStatus();
  keeps_ = kernels::Buffer();
  absl::StatusOr<kernels::Buffer> b = kernels::Buffer::Allocate(backend_->memory(), bytes);
  if (!b.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session evictor: no backend memory for the keep lists of ", lens_.size(),
                     " heads of ", widest, " slots: ", b.status().message()));
  }
  keeps_ = std::move(*b);
  return absl::OkStatus();
}

absl::Status LazyBackendState::Observe(const float* probs, int64_t stride, int n_heads,
                                       const std::vector<int32_t>& lens_now, float alpha, int t) {
  RECALL_CHECK(lens_now.size() == lens_.size() && cap_ > 0) << "lazy state not sized";
  kernels::LazyObserveArgs a;
  a.probs = probs;
  a.probs_stride = stride;
  a.n_layers = n_layers_;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads_;
  a.ts = state_.as<int32_t>();
  a.mri = a.ts + lens_.size() * static_cast<size_t>(cap_);
  a.state_stride = cap_;
  a.old_lens = lens_.data();
  a.lens = lens_now.data();
  a.alpha = alpha;
  a.t = t;
  backend_->LazyObserve(a);
  lens_ = lens_now;
  host_stale_ = true;
  return backend_->Health();
}

absl::Status LazyBackendState::Evict(const kernels::PagedKv& kv, const std::vector<int32_t>& rows,
                                     const std::vector<int32_t>& keeps, int window, int t,
                                     const std::function<void(size_t, const int32_t*, int)>& kept) {
  const int widest = keeps.empty() ? 0 : *std::max_element(keeps.begin(), keeps.end());
  RECALL_CHECK(keeps_.bytes() >= lens_.size() * static_cast<size_t>(widest) * sizeof(int32_t))
      << "keep lists not sized for budget " << widest;
  evict_lens_.clear();
  for (const int32_t r : rows) evict_lens_.push_back(lens_[static_cast<size_t>(r)]);
  const size_t cap = static_cast<size_t>(cap_);
  kernels::LazyEvictArgs e;
  e.kv = kv;
  e.ts = state_.as<int32_t>();
  e.mri = e.ts + lens_.size() * cap;
  e.state_stride = cap_;
  e.n_rows = static_cast<int>(rows.size());
  e.rows = rows.data();
  e.lens = evict_lens_.data();
  e.keeps = keeps.data();
  e.window = window;
  e.t = t;
  e.keep_out = keeps_.as<int32_t>();
  e.keep_stride = widest;
  backend_->LazyEvict(e);
  image_.resize(rows.size() * static_cast<size_t>(widest));
  backend_->memory().CopyOut(image_.data(), e.keep_out, image_.size() * sizeof(int32_t));
  RECALL_RETURN_IF_ERROR(backend_->Health());
  for (size_t i = 0; i < rows.size(); ++i) {
    kept(i, image_.data() + i * static_cast<size_t>(widest), evict_lens_[i]);
    lens_[static_cast<size_t>(rows[i])] = keeps[i];
  }
  return absl::OkStatus();
}

}  // namespace recall::cache::eviction
