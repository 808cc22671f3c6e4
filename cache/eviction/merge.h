// Merging evicted tokens into the ones kept (EVICTION.md section 4, "merging what is evicted";
// after D2O, Wan et al., arXiv 2406.13035, and CaM, Zhang et al., ICML 2024).
//
// Eviction drops a token's contribution to every later attention output. When an evicted
// slot e has a kept neighbour j whose key points the same way, later queries attend to the two
// alike, so j can carry e's value as well: with weights w (an attention estimate),
//     v_j <- (w_j v_j + sum_{e -> j} w_e v_e) / (w_j + sum_{e -> j} w_e)
// and, when keys are merged too, the same for k_j. Each evicted slot goes to the kept slot of
// the largest cosine similarity of keys, and only when that similarity is at least
// `threshold`; nothing else changes. The cache then holds the same slots as without merging,
// so memory and the keep decision (hence TP agreement) are unchanged: only kept rows' contents
// move, and each rank merges its own heads from its own rows.
#pragma once

#include <cstdint>
#include <vector>

namespace recall::cache::eviction {

struct MergeOptions {
  float threshold = 0.5f;   // least cosine similarity of keys for a merge, in [-1, 1]
  bool merge_keys = false;  // also move the kept key towards the evicted ones
};

struct MergeScratch {
  std::vector<double> mass;          // [len] weight merged into each slot
  std::vector<double> sum_v, sum_k;  // [len, head_dim]
  std::vector<float> inv_norm;       // [len] 1 / ||k_j||
  std::vector<uint8_t> kept;         // [len]
};

// keys, values: [len, head_dim], rows of one (layer, KV head); weight: [len] non-negative
// weights (an attention estimate), or null for equal weights; keep: ascending slots kept.
// Merges every evicted slot as above, rewriting the kept rows of `values` (and of `keys` with
// merge_keys) in place. Returns the number of slots merged. Rows of slots not kept are left
// as they were. A zero key merges nowhere; a kept slot whose weights sum to 0 is unchanged.
int MergeEvicted(const MergeOptions& options, const double* weight, int len,
                 const std::vector<int32_t>& keep, int head_dim, float* keys, float* values,
                 MergeScratch* scratch);

}  // namespace recall::cache::eviction
