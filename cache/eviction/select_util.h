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
void KeepTopK(const PolicyOptions& options, int budget, int begin, int end, int k,
              const SelectContext& ctx, std::vector<int32_t>* keep);

// Appends begin, begin + 1, ..., end - 1 to *keep.
void KeepRange(int begin, int end, std::vector<int32_t>* keep);

}  // namespace recall::cache::eviction::internal
