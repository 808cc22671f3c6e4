// H2oPolicy ("h2o", Heavy-Hitter Oracle): accumulates each slot's attention over every
// decode step it has been in the cache (score += p). Whenever len > C: keep the most recent
// W = options.window slots plus the top (C - W) older slots by accumulated score (ties: the
// older slot). Per KV head, with the GQA max reduction.
#pragma once

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

class H2oPolicy : public EvictionPolicy {
 public:
  explicit H2oPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "h2o"; }
  uint32_t state_arrays() const override { return kScoreArray; }
  int min_budget() const override { return options().window; }
  void Observe(HeadState* state, const float* p, int len, int t) const override;
  bool ShouldEvict(int len, int budget, int t) const override { return len > budget; }
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;
};

}  // namespace recall::cache::eviction
