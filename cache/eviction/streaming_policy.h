// StreamingPolicy ("streaming", StreamingLLM): whenever len > C, keep the first `sinks`
// slots (attention sinks) and the most recent C - sinks slots. With value protection, up to
// floor(value_protection * C) of the non-sink quota go to the largest-value-range slots
// instead of the oldest recent ones.
#pragma once

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

class StreamingPolicy : public EvictionPolicy {
 public:
  explicit StreamingPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "streaming"; }
  uint32_t state_arrays() const override { return kNoStateArrays; }
  bool needs_attention() const override { return false; }
  int min_budget() const override { return options().sinks + 1; }
  void Observe(HeadState* state, const float* p, int len, int t) const override {}
  bool ShouldEvict(int len, int budget, int t) const override { return len > budget; }
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;
};

}  // namespace recall::cache::eviction
