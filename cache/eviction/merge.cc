#include "cache/eviction/merge.h"

#include <cmath>

namespace recall::cache::eviction {

int MergeEvicted(const MergeOptions& options, const double* weight, int len,
                 const std::vector<int32_t>& keep, int head_dim, float* keys, float* values,
                 MergeScratch* s) {
  const size_t n = static_cast<size_t>(len);
  const size_t d = static_cast<size_t>(head_dim);
  s->kept.assign(n, 0);
  for (const int32_t j : keep) s->kept[static_cast<size_t>(j)] = 1;
  s->inv_norm.resize(n);
  for (size_t j = 0; j < n; ++j) {
    double sq = 0;
    for (size_t i = 0; i < d; ++i) sq += static_cast<double>(keys[j * d + i]) * keys[j * d + i];
    s->inv_norm[j] = sq > 0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
  }
  s->mass.assign(n, 0.0);
  s->sum_v.assign(n * d, 0.0);
  if (options.merge_keys) s->sum_k.assign(n * d, 0.0);
  int merged = 0;
  for (size_t e = 0; e < n; ++e) {
    if (s->kept[e] || s->inv_norm[e] == 0.0f) continue;
    const float* ke = keys + e * d;
    int best = -1;
    float best_sim = options.threshold;
    for (const int32_t j : keep) {
      if (s->inv_norm[static_cast<size_t>(j)] == 0.0f) continue;
      const float* kj = keys + static_cast<size_t>(j) * d;
      float dot = 0;
      for (size_t i = 0; i < d; ++i) dot += ke[i] * kj[i];
      const float sim = dot * s->inv_norm[e] * s->inv_norm[static_cast<size_t>(j)];
      if (sim >= best_sim) {
        best_sim = sim;
        best = j;
      }
    }
    if (best < 0) continue;
    const double w = weight != nullptr ? weight[e] : 1.0;
    if (!(w > 0)) continue;
    const size_t b = static_cast<size_t>(best);
    s->mass[b] += w;
    for (size_t i = 0; i < d; ++i) s->sum_v[b * d + i] += w * values[e * d + i];
    if (options.merge_keys) {
      for (size_t i = 0; i < d; ++i) s->sum_k[b * d + i] += w * ke[i];
    }
    ++merged;
  }
  for (const int32_t jj : keep) {
    const size_t j = static_cast<size_t>(jj);
    if (s->mass[j] == 0.0) continue;
    const double wj = weight != nullptr ? weight[j] : 1.0;
    const double total = wj + s->mass[j];
    if (!(total > 0)) continue;
    for (size_t i = 0; i < d; ++i) {
      values[j * d + i] =
          static_cast<float>((wj * values[j * d + i] + s->sum_v[j * d + i]) / total);
    }
    if (options.merge_keys) {
      for (size_t i = 0; i < d; ++i) {
        keys[j * d + i] = static_cast<float>((wj * keys[j * d + i] + s->sum_k[j * d + i]) / total);
      }
    }
  }
  return merged;
}

}  // namespace recall::cache::eviction
