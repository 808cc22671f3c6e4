// LazyBackendState: LazyEviction's per-slot state (ts and mri) of one sequence, kept in a
// backend's memory, so a GPU evictor's decode step reads no probabilities on the host.
//
// One row per (layer, KV head), r = layer * n_kv_heads + head: ts then mri planes,
// [2][rows][capacity] int32, grown by doubling. The host copy is the evictor's HeadStates
// (ts and mri), passed in where they move: Observe puts the
// backend ahead of them (stale), Pull brings them up to date, growing copies them over.
// Evict runs Backend::LazyEvict, which selects and compacts the cache and the state there;
// only the keep lists come back to the host.
//
// Not thread safe: one sequence is stepped by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "cache/eviction/eviction_policy.h"
#include "kernels/backend.h"
#include "kernels/memory.h"

namespace recall::cache::eviction {

class LazyBackendState {
 public:
  // `backend` must outlive this.
  LazyBackendState(kernels::Backend* backend, int n_layers, int n_kv_heads);

  int rows() const { return static_cast<int>(lens_.size()); }
  // The backend memory the state holds (both planes at their capacity).
  int64_t bytes() const {
    return 2 * static_cast<int64_t>(lens_.size()) * cap_ * static_cast<int64_t>(sizeof(int32_t));
  }
  // Slots the backend state holds per row.
  const std::vector<int32_t>& lens() const { return lens_; }

  // Makes room for `max_len` slots per row (keeping the contents, through `host`).
  // ResourceExhausted when the backend has no memory for it.
  absl::Status Ensure(int max_len, std::vector<HeadState>& host);
  // Makes room for keep lists of `widest` slots for every row.
  absl::Status EnsureKeepLists(int widest);
  // Brings `host` up to date when the backend state is ahead of it.
  void Pull(std::vector<HeadState>& host);
  // The host copy (pulled, then cut) gave back its rows' newest slots: each row keeps as many
  // slots as host[r] has (the first ones, which stay where they are).
  void Shrink(const std::vector<HeadState>& host);

  // Step t's Backend::LazyObserve over probabilities in backend memory ([n_layers, n_heads,
  // stride]); lens_now: the cache's lengths per row now (slots appended since the last step
  // are added). The backend's first error, if any.
  absl::Status Observe(const float* probs, int64_t stride, int n_heads,
                       const std::vector<int32_t>& lens_now, float alpha, int t);

  // Backend::LazyEvict of `rows` (ascending) at step t, each keeping keeps[i] slots (the
  // keep lists must have room: EnsureKeepLists), then kept(i, keep, len) for each with its
  // keep list on the host (keeps[i] slots) and the length it had, in order. The rows'
  // lengths become keeps[i]. The backend's first error, if any (before any kept call).
  absl::Status Evict(const kernels::PagedKv& kv, const std::vector<int32_t>& rows,
                     const std::vector<int32_t>& keeps, int window, int t,
                     const std::function<void(size_t, const int32_t*, int)>& kept);

 private:
  // Host -> backend (the whole state).
  void Push(const std::vector<HeadState>& host);

  kernels::Backend* const backend_;
  const int n_layers_, n_kv_heads_;
  kernels::Buffer state_, keeps_;
  int cap_ = 0;
  std::vector<int32_t> lens_;        // [rows] slots the backend state holds
  std::vector<int32_t> evict_lens_;  // LazyEvict's rows' lengths
  std::vector<int32_t> image_;       // host staging
  bool host_stale_ = false;          // the backend state is ahead of the host copy
};

}  // namespace recall::cache::eviction
