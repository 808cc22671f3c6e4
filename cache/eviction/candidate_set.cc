#include "cache/eviction/candidate_set.h"

#include <algorithm>

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {

int CandidateSet::quota(int budget) const {
  return std::max(0, budget - static_cast<int>(always.size()));
}

namespace internal {

void CaptureCandidates(float value_protection, int begin, int end, const SelectContext& ctx) {
  CandidateSet& c = *ctx.capture;
  RECALL_CHECK(!c.captured) << "scoring mode: a policy ranked two candidate ranges";
  RECALL_CHECK(ctx.scratch != nullptr && static_cast<int>(ctx.scratch->score.size()) >= end)
      << "scoring mode: scores not filled";
  c.captured = true;
  c.begin = begin;
  c.end = end;
  c.score.assign(ctx.scratch->score.begin(), ctx.scratch->score.begin() + end);
  c.value_protection = ctx.value_range != nullptr ? value_protection : 0.0f;
  if (c.value_protection > 0.0f) {
    c.value_range.assign(ctx.value_range, ctx.value_range + end);
  } else {
    c.value_range.clear();
  }
}

}  // namespace internal

void ScoreCandidates(const EvictionPolicy& policy, const HeadState& state, int len, int t,
                     const SelectContext& ctx, CandidateSet* out) {
  out->always.clear();
  out->captured = false;
  out->begin = out->end = len;
  out->value_protection = 0.0f;
  const int budget = policy.min_budget();
  if (len <= budget) {
    internal::KeepRange(0, len, &out->always);
    return;
  }
  SelectContext c = ctx;
  c.capture = out;
  policy.SelectKeep(state, len, budget, t, c, &out->always);
  if (!out->captured) out->begin = out->end = len;
  std::sort(out->always.begin(), out->always.end());
}

void SelectUniform(const CandidateSet& c, int budget, SelectScratch* scratch,
                   std::vector<int32_t>* keep) {
  keep->assign(c.always.begin(), c.always.end());
  if (c.num_candidates() == 0) return;
  scratch->score.assign(c.score.begin(), c.score.begin() + c.end);
  SelectContext ctx;
  ctx.scratch = scratch;
  ctx.value_range = c.value_protection > 0.0f ? c.value_range.data() : nullptr;
  const size_t mid = keep->size();
  internal::KeepTopK(c.value_protection, budget, c.begin, c.end, c.quota(budget), ctx, keep);
  std::inplace_merge(keep->begin(), keep->begin() + static_cast<std::ptrdiff_t>(mid), keep->end());
}

}  // namespace recall::cache::eviction
