// Ada-KV: head-adaptive budgets within a layer (EVICTION.md sections 2 and 4; Feng et al.,
// arXiv 2407.11550). Enabled by BudgetOptions::head_adaptive; works with every per-KV-head
// policy, on the scores its SelectKeep ranks (candidate_set.h), after CAOTE if that is on.
//
// Uniform mode keeps C slots in each of the layer's H KV heads. Head-adaptive mode keeps
// H * C slots in the layer as a whole, chosen across heads, so heads whose attention is spread
// keep more and heads focused on a few slots keep fewer. Per head h with candidate set c_h:
//   quota_h = C - |always_h|  (what uniform mode would keep among its candidates; the slots
//                             the policy always keeps, recent window and sinks, stay per head)
//   1. value protection, as in uniform mode: the min(quota_h, floor(f * C)) candidates with
//      the largest value range (f = the policy's value-protection fraction, if any);
//   2. safeguard: the next min(floor(safeguard * quota_h), quota_h - step 1) candidates by
//      score, so every head keeps at least that share of its selection budget (Ada-KV's
//      floor_alpha, 0.2 by default: floor(0.2 * (C - W)) selected slots beyond the window W);
//   3. the remaining R = sum_h quota_h - (slots taken in 1 and 2) are the global top R of all
//      heads' other candidates by (score descending, head ascending, slot ascending): exact,
//      and deterministic on ties.
// Every step is limited by the candidates a head has, so the layer keeps exactly
// min(H * C, all slots) slots; a head short of candidates leaves its quota to the others.
// With H = 1, or scores that split evenly, this is uniform mode.
//
// Notes:
//  - The SequenceCache shares block tables across (layer, head), so the blocks held follow
//    the LONGEST head: uneven heads save attention work but can hold more memory than
//    uniform mode at the same budget.
//  - Tensor parallelism: with a communicator, SessionEvictor all-gathers every rank's candidate
//    sets (tp_sync.h) and runs this selection over all the model's KV heads on every rank, so
//    the global top-k is exact and the same as with one rank (EVICTION.md section 5).
//  - Layer-shared policies (TOVA) keep one set for all heads, which contradicts per-head
//    budgets; SessionEvictor::Create rejects the combination.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/eviction/candidate_set.h"

namespace recall::cache::eviction {

inline constexpr double kAdaKvSafeguard = 0.2;

struct HeadAdaptiveScratch {
  struct Entry {
    double score;
    int32_t head;
    int32_t slot;
  };
  std::vector<Entry> pool;
  std::vector<int32_t> order;
};

// heads[0..n): the candidate sets of one layer's KV heads; budget: C tokens per head;
// safeguard in [0, 1]. Writes (*keeps)[h] for h < n (resized to n): the slots head h keeps,
// ascending. No allocation once the scratch and keep lists have grown.
void SelectHeadAdaptive(const CandidateSet* heads, int n, int budget, double safeguard,
                        HeadAdaptiveScratch* scratch, std::vector<std::vector<int32_t>>* keeps);

}  // namespace recall::cache::eviction
