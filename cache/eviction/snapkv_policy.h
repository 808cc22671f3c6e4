// SnapKvPolicy ("snapkv", SnapKV, EVICTION.md section 4): one-time prompt compression at
// prefill. compresses_prefill(): the engine hands the last W = options.window prompt queries
// (after RoPE) to SessionEvictor::CompressPrefill, which for every (layer, KV head) with more
// than C slots calls WindowScores and then SelectKeep.
//
// WindowScores, for the KV head's G query heads and the W window queries (query i is the
// token in slot len - W + i and sees slots [0, len - W + i], causally):
//   p_gi = softmax_j(scale * q_gi . k_j) over j <= len - W + i            (double)
//   a_g  = sum over i of p_gi, on the len - W candidate slots (the window is excluded)
//   score = mean over g of avg_pool5(a_g)  (kernel 5, stride 1, zero padding, / 5: torch
//           avg_pool1d; pooling and the GQA mean are linear, so their order does not matter)
// SelectKeep keeps the top C - W candidates by score (ties: older kept; value protection
// applies to the quota) plus the W window slots.
// Decode: SnapKV compresses only the prompt; this policy never evicts at decode
// (ShouldEvict is false, no attention needed), so the cache grows by one slot per generated
// token after prefill, as in the released SnapKV.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

inline constexpr int kSnapKvPoolKernel = 5;

class SnapKvPolicy : public EvictionPolicy {
 public:
  explicit SnapKvPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "snapkv"; }
  // Scores the prompt once, in a state of its own (SessionEvictor::CompressPrefill).
  uint32_t state_arrays() const override { return kNoStateArrays; }
  bool needs_attention() const override { return false; }
  bool compresses_prefill() const override { return true; }
  int min_budget() const override { return options().window; }
  void Observe(HeadState* state, const float* p, int len, int t) const override {}
  bool ShouldEvict(int len, int budget, int t) const override { return false; }
  // REQUIRES: state.score[j] holds WindowScores' score for j < len - min(window, len).
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;

  // Writes score[0..len - w) as above.
  //   keys:    [len, head_dim]           the KV head's K rows in slot order
  //   queries: [w, n_heads, head_dim]    one layer's window queries (after RoPE)
  //   first_head, group: the KV head's query heads are first_head .. first_head + group - 1
  // `scratch` is reused (no allocation after warm-up). REQUIRES: 1 <= w <= len.
  static void WindowScores(const float* keys, int len, const float* queries, int w, int n_heads,
                           int first_head, int group, int head_dim, float scale,
                           SelectScratch* scratch, float* score);
};

}  // namespace recall::cache::eviction
