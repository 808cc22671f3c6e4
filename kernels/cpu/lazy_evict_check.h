// CheckLazyEvict: a quick check, run when a backend is created, that its LazyEviction step
// (Backend::LazyEvict) keeps and moves exactly what the host reference does, on a small paged
// cache in the backend's memory: four rows from 40 to 2100 slots over shuffled blocks, scores
// with many exact ties, budgets from the window alone to all but one slot. A backend whose
// eviction kernel has never run on its hardware can then fall back to the host (the CUDA
// backend does) instead of keeping the wrong tokens.
#pragma once

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::kernels {

// OK, or InternalError naming the first difference from the reference (a keep list, a state
// or a K/V element), or the backend's own error. Allocates about 5 MB of the backend's memory
// for the duration of the call.
absl::Status CheckLazyEvict(Backend& backend);

}  // namespace recall::kernels
