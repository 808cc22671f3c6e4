// Scoring and selection of EpiCache's block-wise prefill (EVICTION.md section 2, step 5).
//
// After a block of history is in a sequence's cache, the episode's patched prompt (P tokens)
// is appended as extra queries and then removed again (the caller compacts its slots away
// and rewinds the position). For one KV head with G query heads, slots [0, base) are the
// history tokens to score and slots [base, base + P) the patch itself:
//   query i (slot base + i) sees slots [0, base + i] (causal, as it ran);
//   p_gij   = softmax_j(scale * q_gi . k_j) over j <= base + i      (double)
//   score_j = max over the G query heads g and the P queries i of p_gij,  for j < base.
// The max (not a sum) lets a token matter if any query of the episode's topic attends to it.
//
// Selection keeps the `budget` highest-scoring slots of a head (KeepTop), or, in the
// head-adaptive mode, budget * n_heads slots over all KV heads of a layer (KeepTopAcrossHeads),
// so heads keep different counts. Ties keep the older slot. Keep lists ascend.
//
// Pure functions; thread safe with distinct scratch.
#pragma once

#include <cstdint>
#include <vector>

namespace recall::cache::episodic {

// Writes score[0, base) as above.
//   keys:    [base + p, head_dim]   the KV head's K rows in slot order
//   queries: [p, n_heads, head_dim] one layer's patch queries (after RoPE, unscaled)
//   first_head, group: the KV head's query heads are first_head .. first_head + group - 1
// REQUIRES: p >= 1, base >= 0. `logits` is scratch.
void PatchScores(const float* keys, int base, const float* queries, int p, int n_heads,
                 int first_head, int group, int head_dim, float scale,
                 std::vector<double>* logits, float* score);

// The min(budget, n) slots of [0, n) with the highest score, ascending; ties: older kept.
// `order` is scratch.
void KeepTop(const float* score, int n, int budget, std::vector<int32_t>* order,
             std::vector<int32_t>* keep);

// Head-adaptive: the min(total, sum of lens) (head, slot) pairs with the highest score over
// all heads (ties: lower head, then older slot); keeps[h] receives head h's slots, ascending.
// scores[h] has lens[h] entries.
void KeepTopAcrossHeads(const std::vector<const float*>& scores, const std::vector<int>& lens,
                        int64_t total, std::vector<std::vector<int32_t>>* keeps);

}  // namespace recall::cache::episodic
