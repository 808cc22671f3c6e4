// FullKvPolicy ("full"): never evicts. The reference for every quality figure.
#pragma once

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

class FullKvPolicy : public EvictionPolicy {
 public:
  explicit FullKvPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "full"; }
  uint32_t state_arrays() const override { return kNoStateArrays; }
  bool needs_attention() const override { return false; }
  void Observe(HeadState* state, const float* p, int len, int t) const override {}
  bool ShouldEvict(int len, int budget, int t) const override { return false; }
  // Keeps every slot (budget is ignored).
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;
};

}  // namespace recall::cache::eviction
