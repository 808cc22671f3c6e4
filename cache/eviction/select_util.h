// Shared top-k selection with value protection, used by every policy's SelectKeep.
// Internal to cache/eviction.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction::internal {

// Appends to *keep, in ascending order, the k highest-ranked slots of [begin, end) (all of
// them if k >= end - begin). Ranking: first, if options.value_protection > 0 and
// ctx.value_range != null, the q = min(k, floor(value_protection * budget)) slots with the
// largest value range; then the remaining k - q by ctx.scratch->score[j] (which the policy
// filled for j in [begin, end)). Both rankings order by (value descending, slot ascending),
// so ties keep the older slot. REQUIRES: scratch->score.size() >= end, 0 <= begin <= end.
// In scoring mode (ctx.capture != null) appends nothing and records the candidates instead
// (candidate_set.h).
void KeepTopK(const PolicyOptions& options, int budget, int begin, int end, int k,
              const SelectContext& ctx, std::vector<int32_t>* keep);

// As above with the value-protection fraction given explicitly (VaSE's built-in quota).
void KeepTopK(float value_protection, int budget, int begin, int end, int k,
              const SelectContext& ctx, std::vector<int32_t>* keep);

// Pools x[0..n) with a centred window of `kernel` (odd) slots, stride 1, padding kernel / 2:
// out[j] = sum (avg) or max (max) of x[i] for |i - j| <= kernel / 2, 0 <= i < n. The average
// divides by `kernel` even at the edges (torch avg_pool1d, count_include_pad = True); the
// max ignores the padding (torch max_pool1d). REQUIRES: out != x.
void AvgPool(const double* x, int n, int kernel, double* out);
void MaxPool(const double* x, int n, int kernel, double* out);

// Appends begin, begin + 1, ..., end - 1 to *keep.
void KeepRange(int begin, int end, std::vector<int32_t>* keep);

}  // namespace recall::cache::eviction::internal
