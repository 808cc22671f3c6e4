// VasePolicy ("vase", VaSE, EVICTION.md section 3): protect large values, evict
// stochastically.
//
// Observe at step t: state.score accumulates the step's attention over the current window
// of W = options.window steps; the window restarts (score = p) at every t with
// (t - 1) % W == 0, so at an eviction step (t % W == 0) score_j is the sum of the attention
// of the last W queries that saw slot j. ts (left as AppendSlots set it, t_append - 1) tells
// how many did: n_j = min(t - ts_j, W) (a slot appended inside the window was seen only by
// the queries after it).
// Eviction only when len > C and t % W == 0 (lagged, like LazyEviction). SelectKeep keeps:
//   1. the first `sinks` slots (default 4);
//   2. of the others, the floor(f * C) slots with the largest value range (max - min of V over
//      head_dim; f = options.value_protection if > 0, else kVaseValueQuota = 0.25);
//   3. the remaining C - sinks - quota slots sampled WITHOUT replacement with probability
//      proportional to w_j = avg_pool5(mean attention)_j, mean_j = score_j / n_j, pooled over
//      all slots in slot order (kernel 5, zero padding, divided by 5). Sampling uses the
//      Efraimidis-Spirakis keys log(u_j) / w_j (top-k of the keys is distributed exactly as
//      k successive draws without replacement); slots with w_j = 0 come after every positive
//      one, in random order. u_j is a counter-based hash of (options.seed, ctx.session,
//      ctx.layer, ctx.head, ctx.eviction_count, j): reproducible, no state, identical on
//      every tensor-parallel rank.
// Choice: no recent window is protected (section 3 names only sinks and the value quota);
// recent slots compete with their mean over the queries that saw them, which the newest
// tokens usually win. Cache length peaks at C + W and is exactly C after an eviction.
// REQUIRES of SelectKeep: ctx.value_range != null (needs_value_range()).
#pragma once

#include <cstdint>

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

inline constexpr float kVaseValueQuota = 0.25f;
inline constexpr int kVasePoolKernel = 5;

class VasePolicy : public EvictionPolicy {
 public:
  explicit VasePolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "vase"; }
  uint32_t state_arrays() const override { return kTsArray | kScoreArray; }
  int min_budget() const override { return options().sinks + 1; }
  bool needs_value_range() const override { return true; }
  void Observe(HeadState* state, const float* p, int len, int t) const override;
  bool ShouldEvict(int len, int budget, int t) const override {
    return len > budget && t % options().window == 0;
  }
  int eviction_lag() const override { return options().window; }
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;

  // The value-range quota fraction in use (value_protection if > 0, else kVaseValueQuota).
  float value_quota() const;
  // Uniform in (0, 1) from the seed context and slot index (splitmix64 based).
  static double Uniform(uint64_t seed, const SelectContext& ctx, int slot);
};

}  // namespace recall::cache::eviction
