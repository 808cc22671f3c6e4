// LazyPolicy ("lazy", LazyEviction, EVICTION.md section 1): MRI-based lagged eviction.
//
// State per slot (int32, exact at any step): ts = last step the slot was important
// (AppendSlots: t - 1 for a slot appended before step t's Observe, so prompt slots start at
// 0), mri = maximum recurrence interval (starts at 0).
// Observe at step t: slot j is important iff p_j >= alpha; then mri_j = max(mri_j, t - ts_j)
// and ts_j = t.
// Eviction only when len > C and t % W == 0. Every slot outside the last W is scored
//   H1 = 2 / (1 + exp(1 + (t - ts) / (mri + 1e-5)))
//   H2 = mri > 0 ? 2 / (1 + exp(mri - 1)) : 0
//   S  = H1 + H2                  (in double, kernels/lazy_score.h)
// and the top (C - W) by S (ties: older slot kept) are kept with the last W slots. Cache
// length peaks at C + W between evictions and is exactly C after one.
#pragma once

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

class LazyPolicy : public EvictionPolicy {
 public:
  explicit LazyPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "lazy"; }
  uint32_t state_arrays() const override { return kTsArray | kMriArray; }
  bool has_backend_step() const override { return true; }
  int min_budget() const override { return options().window; }
  void Observe(HeadState* state, const float* p, int len, int t) const override;
  bool ShouldEvict(int len, int budget, int t) const override {
    return len > budget && t % options().window == 0;
  }
  int eviction_lag() const override { return options().window; }
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;

  // S(t, ts, mri) as above: kernels::LazyScore, bit for bit the score the CUDA eviction
  // kernel ranks by.
  static double Score(int t, int32_t ts, int32_t mri);

 protected:
  // The score SelectKeep ranks slot j of `state` (len slots) by at step t: Score for "lazy";
  // lazy+ overrides it.
  virtual double SlotScore(const HeadState& state, int j, int len, int t) const;
};

}  // namespace recall::cache::eviction
