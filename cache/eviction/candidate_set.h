// CandidateSet: a policy's selection for one (layer, KV head), split into what it always keeps
// and the candidates it would rank, so that SessionEvictor can rescore the candidates (CAOTE,
// caote.h) or choose them over all heads of a layer (Ada-KV, head_adaptive.h).
//
// Scoring mode. Every policy's SelectKeep appends the slots it always keeps (recent window,
// sinks) with internal::KeepRange and ranks the rest with ONE internal::KeepTopK call over a
// candidate range [begin, end) after filling SelectScratch::score for it. With
// SelectContext::capture set, KeepTopK appends nothing and records the range, the scores and
// the value-protection fraction it would have applied here instead. A policy that never calls
// KeepTopK (FullKV, or a head short enough to be kept whole) captures no candidates.
//
// ScoreCandidates followed by SelectUniform with the same budget reproduces SelectKeep's keep
// list exactly (tested for every policy), so the two-phase path changes nothing unless the
// scores are changed in between or the budget is split differently across heads.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

struct CandidateSet {
  // Slots the policy keeps regardless of the budget, ascending; disjoint from [begin, end).
  std::vector<int32_t> always;
  // Candidates are the slots [begin, end); begin == end when there are none.
  int begin = 0;
  int end = 0;
  // Indexed by slot (size >= end): the policy's score of each candidate (higher = keep).
  std::vector<double> score;
  // The value-protection fraction KeepTopK would have applied (0 when off or when the context
  // had no value ranges); if > 0, value_range (indexed by slot, size >= end) holds the
  // candidates' value ranges.
  float value_protection = 0.0f;
  std::vector<float> value_range;
  // Set by KeepTopK in scoring mode (at most one call per SelectKeep).
  bool captured = false;

  int num_candidates() const { return end - begin; }
  // Tokens the policy would keep among the candidates under `budget`: budget - |always|.
  int quota(int budget) const;
};

// Runs policy.SelectKeep(state, len, ., t, ctx) in scoring mode and fills *out (previous
// contents replaced; its vectors keep their capacity). The budget passed to SelectKeep is
// min_budget(), which only has to be small enough that the policy does not keep everything;
// the quota is applied later. REQUIRES: ctx.scratch != null, state.size() == len.
void ScoreCandidates(const EvictionPolicy& policy, const HeadState& state, int len, int t,
                     const SelectContext& ctx, CandidateSet* out);

// Chooses, as the policy would with `budget`, min(quota, candidates) candidates: first the
// floor(value_protection * budget) largest value ranges (if value_protection > 0), then the
// highest scores; ties keep the older slot. Writes always + chosen, ascending, to *keep.
// `scratch` is reused.
void SelectUniform(const CandidateSet& c, int budget, SelectScratch* scratch,
                   std::vector<int32_t>* keep);

namespace internal {
// KeepTopK's scoring-mode half: records [begin, end), the scores and value ranges into
// *ctx.capture. CHECKs that nothing was captured yet for this SelectKeep.
void CaptureCandidates(float value_protection, int begin, int end, const SelectContext& ctx);
}  // namespace internal

}  // namespace recall::cache::eviction
