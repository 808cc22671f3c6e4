// TovaPolicy ("tova", Token Omission Via Attention): layer_shared(). Observe stores the
// last query's attention, averaged over ALL query heads of the layer by the caller
// (AverageOverHeads), in state.score. Every step with len > C it drops the len - C slots
// with the lowest such attention (one slot per step in steady state; more at the first
// decode step after a prompt longer than C, since the prompt is not compressed at prefill).
// Any slot may be dropped, including the newest. Ties: the newer slot is dropped. The same
// keep list is applied to every KV head of the layer.
#pragma once

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

class TovaPolicy : public EvictionPolicy {
 public:
  explicit TovaPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "tova"; }
  uint32_t state_arrays() const override { return kScoreArray; }
  bool layer_shared() const override { return true; }
  void Observe(HeadState* state, const float* p, int len, int t) const override;
  bool ShouldEvict(int len, int budget, int t) const override { return len > budget; }
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;
};

}  // namespace recall::cache::eviction
