// CAOTE: a value-aware eviction score (EVICTION.md section 4; Goel et al., "CAOTE: KV caching
// through attention output error based token eviction", arXiv 2504.14051).
//
// For one query and one KV head with attention probabilities a_j over the cached slots
// (sum_j a_j = 1), values v_j and output o = sum_j a_j v_j, evicting slot j alone and
// renormalising the rest gives o' = (o - a_j v_j) / (1 - a_j), so the output moves by
//     c_j = ||o - o'|| = a_j / (1 - a_j) * ||o - v_j||_2,
// CAOTE's eviction error: keep the slots with the largest c_j.
//
// Computed in the equivalent form c_j = a_j * ||v_j - o'_j||, o'_j = (o - a_j v_j) / r_j, with
// r_j = S - a_j, S = sum_i a_i (= 1 - a_j for a distribution), clamped to at least
// kCaoteMinRemainder. For r_j >= the clamp it equals the formula above; as a_j -> 1 the
// literal form is 0/0 (o -> v_j), and clamping only its denominator would send c_j to 0 and
// evict the slot that holds all the attention; this form tends to a_j * ||v_j - mean of the
// other values||, and at r_j = 0 exactly gives a_j * ||v_j|| (the output would vanish), so
// that slot ranks first.
//
// SessionEvictor applies it to the candidates of a policy (candidate_set.h) as
// PolicyOptions::meta_score says:
//  - kCaote (meta-heuristic, as the paper combines CAOTE with H2O, TOVA and SnapKV): a is the
//    policy's own score of the candidates normalised to sum to 1 (NormalizeScores), o and the
//    c_j are computed over the candidates (the slots the policy always keeps are not ranked).
//    For TOVA the score is the current query's attention, so this is CAOTE on the current
//    query; for H2O the accumulated attention, for SnapKV the pooled window attention, for
//    LazyEviction its recurrence score S.
//  - kCaoteCurrentQuery: a is this decode step's attention over ALL cached slots of the head
//    (GroupMeanAttention), o the head's actual output; c_j replaces the policy's score.
// Layer-shared policies (TOVA) keep one set for all KV heads: the layer's score of a slot is
// the sum over the KV heads of the head's c_j (each head with its own values).
//
// GQA reduction: the MEAN over the G query heads of a KV head, not the max that LazyEviction's
// importance test uses (ReduceGqaMax). The mean of G softmax rows is again a distribution, and
// since the G heads share the KV head's values, o = sum_j mean_g(a_gj) v_j is exactly the mean
// of the G heads' outputs, so c_j is the exact change of that mean output. The max is not
// normalised (it sums to up to G), which breaks the renormalisation identity above.
#pragma once

#include <cstdint>
#include <vector>

namespace recall::cache::eviction {

inline constexpr double kCaoteMinRemainder = 1e-9;

// c[j] = a[j] * ||v_j - (o - a[j] v_j) / max(S - a[j], kCaoteMinRemainder)||_2 for j < n,
// o = sum_i a[i] v_i, S = sum_i a[i]; i.e. a[j] / (1 - a[j]) * ||o - v_j|| when a sums to 1.
//   a: [n] (non-negative);  values: [n, head_dim], row j = v_j;  c: [n].
// `o` is scratch (resized to head_dim). Computed in double.
void CaoteScores(const double* a, int n, const float* values, int head_dim, std::vector<double>* o,
                 double* c);

// a[j] = max(s[j], 0) / sum_i max(s[i], 0) for j < n; all 0 if that sum is 0.
void NormalizeScores(const double* s, int n, double* a);

// This step's attention of KV head `kv_head` reduced by the mean over its query heads:
// a[j] = 1/G sum_{g < G} probs[(kv_head * G + g) * stride + j] for j < len, G = n_heads /
// n_kv_heads. probs: one layer's [n_heads, stride] slice of BatchItem::attn_probs.
// REQUIRES: n_heads % n_kv_heads == 0, len <= stride.
void GroupMeanAttention(const float* probs, int n_heads, int n_kv_heads, int64_t stride,
                        int kv_head, int len, double* a);

}  // namespace recall::cache::eviction
