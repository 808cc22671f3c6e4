// CheckLazyEvict: a quick check, run when a backend is created, that its LazyEviction step
// (Backend::LazyEvict) keeps and moves exactly what the host reference does, on a small paged
// cache in the backend's memory: four rows from 40 to 2100 slots over shuffled blocks, scores
// with many exact ties at the cut, budgets from the window alone to all but one slot. A
// backend whose eviction kernel has never run on its hardware can then fall back to the host
// (the CUDA backend does) instead of keeping the wrong tokens. CompareLazyEvict runs any such
// case (the CUDA tests run larger ones).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::kernels {

// One LazyEvict call on a cache held on the host.
struct LazyEvictCase {
  PagedKvLayout layout;
  std::vector<std::vector<int32_t>> tables;  // [n_layers] block ids
  std::vector<float> pool;                   // the block pool
  int cap = 0;                               // state_stride
  std::vector<int32_t> state;  // ts, then mri: [2][n_layers * n_kv_heads][cap]
  std::vector<int32_t> rows, lens, keeps;
  int window = 0, t = 0;
};

// Runs the case on `backend` (copied to its memory) and on the host reference: OK if the keep
// lists, the state and every float of the pool are equal; InternalError naming the first
// difference, or the backend's own error.
absl::Status CompareLazyEvict(Backend& backend, const LazyEvictCase& c);

// CompareLazyEvict on the built-in case above. Allocates about 5 MB of the backend's memory
// for the duration of the call.
absl::Status CheckLazyEvict(Backend& backend);

}  // namespace recall::kernels
