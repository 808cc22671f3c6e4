#include "cache/eviction/caote.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace recall::cache::eviction {

void CaoteScores(const double* a, int n, const float* values, int head_dim, std::vector<double>* o,
                 double* c) {
  o->assign(static_cast<size_t>(head_dim), 0.0);
  double total = 0.0;
  for (int j = 0; j < n; ++j) {
    const float* v = values + static_cast<int64_t>(j) * head_dim;
    for (int d = 0; d < head_dim; ++d) (*o)[static_cast<size_t>(d)] += a[j] * v[d];
    total += a[j];
  }
  const double* out = o->data();
  for (int j = 0; j < n; ++j) {
    const float* v = values + static_cast<int64_t>(j) * head_dim;
    const double inv_rest = 1.0 / std::max(total - a[j], kCaoteMinRemainder);
    double sq = 0.0;
    for (int d = 0; d < head_dim; ++d) {
      // v_j minus the output after evicting j (the others' weighted mean).
      const double diff = v[d] - (out[d] - a[j] * v[d]) * inv_rest;
      sq += diff * diff;
    }
    c[j] = a[j] * std::sqrt(sq);
  }
}

void NormalizeScores(const double* s, int n, double* a) {
  double sum = 0.0;
  for (int j = 0; j < n; ++j) sum += std::max(s[j], 0.0);
  const double inv = sum > 0.0 ? 1.0 / sum : 0.0;
  for (int j = 0; j < n; ++j) a[j] = std::max(s[j], 0.0) * inv;
}

void GroupMeanAttention(const float* probs, int n_heads, int n_kv_heads, int64_t stride,
                        int kv_head, int len, double* a) {
  RECALL_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && len <= stride)
      << "GroupMeanAttention: bad shape";
  const int group = n_heads / n_kv_heads;
  std::fill(a, a + len, 0.0);
  for (int g = 0; g < group; ++g) {
    const float* p = probs + (static_cast<int64_t>(kv_head) * group + g) * stride;
    for (int j = 0; j < len; ++j) a[j] += p[j];
  }
  const double inv = 1.0 / group;
  for (int j = 0; j < len; ++j) a[j] *= inv;
}

}  // namespace recall::cache::eviction
