// RkvPolicy ("rkv", R-KV: redundancy-aware KV compression for reasoning models, EVICTION.md
// section 4). Per KV head; needs the K rows of the slots (needs_keys()).
//
// Observe: state.score sums the attention of the last q = min(query_window, interval)
// queries before each compression step: the sum restarts (score = p) at the step q - 1
// before a multiple of `interval` and is left alone outside that window (O(1) then).
// Eviction only when len > C and t % interval == 0 (defaults: interval 128, q = 8). Then,
// with R = len - q candidates (every slot but the last q):
//   importance I_j = max_pool7(score / q)_j over the candidates (kernel 7, stride 1, the
//                    padding ignored: torch max_pool1d with padding 3);
//   redundancy D_j: R-KV's cal_similarity over ALL len keys (released code, retain_direction
//                   "last", threshold 0.5): khat = k / (|k| + 1e-8); S = khat khat^T with a
//                   zero diagonal; for each row i, r_i = the largest j with S_ij > 0.5 (0 if
//                   none, as torch.max over the masked index row gives) and S_{i r_i} = 0
//                   (the most recent similar key is spared); D = softmax_i(mean_j S_ij);
//   score Z_j = lambda * I_j - (1 - lambda) * D_j    (lambda = 0.1, the paper's value; the
//                   released code defaults to 0.07).
// Keep the top C - q candidates by Z (ties: older kept) plus the last q slots; value
// protection (options.value_protection) applies to the C - q quota as in every policy.
// Deviations: the attention is the runtime's probabilities over ALL cached slots (R-KV
// renormalizes each window query's softmax over the non-window slots only: a per-query
// scale); the GQA reduction is SessionEvictor's max of probabilities over the group (R-KV
// takes the max of the logits, kvpress the mean of the probabilities). The prompt is not
// compressed at prefill. Cost per compression O(len^2 * head_dim) per head, in double.
#pragma once

#include <algorithm>
#include <vector>

#include "cache/eviction/eviction_policy.h"

namespace recall::cache::eviction {

inline constexpr int kRkvPoolKernel = 7;
inline constexpr float kRkvSimilarityThreshold = 0.5f;

class RkvPolicy : public EvictionPolicy {
 public:
  explicit RkvPolicy(const PolicyOptions& options) : EvictionPolicy(options) {}
  absl::string_view name() const override { return "rkv"; }
  uint32_t state_arrays() const override { return kScoreArray; }
  int min_budget() const override { return query_window(); }
  bool needs_keys() const override { return true; }
  void Observe(HeadState* state, const float* p, int len, int t) const override;
  bool ShouldEvict(int len, int budget, int t) const override {
    return len > budget && t % options().interval == 0;
  }
  int eviction_lag() const override { return options().interval; }
  void SelectKeep(const HeadState& state, int len, int budget, int t, const SelectContext& ctx,
                  std::vector<int32_t>* keep) const override;

  // q = min(query_window, interval).
  int query_window() const { return std::min(options().query_window, options().interval); }

  // R-KV's redundancy D[0..len) of keys [len, head_dim] (see above). `normed` is scratch.
  static void Redundancy(const float* keys, int len, int head_dim, std::vector<float>* normed,
                         double* out);
};

}  // namespace recall::cache::eviction
