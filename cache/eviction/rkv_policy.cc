#include "cache/eviction/rkv_policy.h"

#include <algorithm>
#include <cmath>

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {

void RkvPolicy::Observe(HeadState* state, const float* p, int len, int t) const {
  RECALL_CHECK(state->size() == len) << "rkv: state has " << state->size() << " slots, len " << len;
  const int interval = options().interval;
  const int q = query_window();
  const int to_go = (interval - t % interval) % interval;  // steps until the next compression
  if (to_go >= q) return;
  float* score = state->score.data();
  if (to_go == q - 1) {
    for (int j = 0; j < len; ++j) score[j] = p[j];
  } else {
    for (int j = 0; j < len; ++j) score[j] += p[j];
  }
}

void RkvPolicy::Redundancy(const float* keys, int len, int head_dim, std::vector<float>* normed,
                           double* out) {
  normed->resize(static_cast<size_t>(len) * head_dim);
  for (int i = 0; i < len; ++i) {
    const float* k = keys + static_cast<int64_t>(i) * head_dim;
    double sq = 0.0;
    for (int d = 0; d < head_dim; ++d) sq += static_cast<double>(k[d]) * k[d];
    const double inv = 1.0 / (std::sqrt(sq) + 1e-8);
    float* n = normed->data() + static_cast<int64_t>(i) * head_dim;
    for (int d = 0; d < head_dim; ++d) n[d] = static_cast<float>(k[d] * inv);
  }
  const float* kn = normed->data();
  for (int i = 0; i < len; ++i) {
    const float* a = kn + static_cast<int64_t>(i) * head_dim;
    double sum = 0.0;
    // S_{i, r_i}: the last j with S_ij > threshold, else S_{i, 0}; it is left out of the sum.
    double last_similar_value = 0.0;
    for (int j = 0; j < len; ++j) {
      double s = 0.0;
      if (j != i) {
        const float* b = kn + static_cast<int64_t>(j) * head_dim;
        for (int d = 0; d < head_dim; ++d) s += static_cast<double>(a[d]) * b[d];
      }
      if (j == 0) last_similar_value = s;
      if (s > kRkvSimilarityThreshold) last_similar_value = s;
      sum += s;
    }
    out[i] = (sum - last_similar_value) / len;
  }
  // Softmax over the slots.
  double mx = out[0];
  for (int i = 1; i < len; ++i) mx = std::max(mx, out[i]);
  double z = 0.0;
  for (int i = 0; i < len; ++i) {
    out[i] = std::exp(out[i] - mx);
    z += out[i];
  }
  for (int i = 0; i < len; ++i) out[i] /= z;
}

void RkvPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                           const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "rkv: budget " << budget << " < query_window";
  RECALL_CHECK(state.size() == len) << "rkv: state/len mismatch";
  RECALL_CHECK(ctx.keys != nullptr && ctx.head_dim > 0) << "rkv: SelectContext::keys is required";
  keep->clear();
  if (len <= budget) {
    internal::KeepRange(0, len, keep);
    return;
  }
  const int q = query_window();
  const int candidates = len - q;
  SelectScratch& s = *ctx.scratch;
  s.aux.resize(static_cast<size_t>(len));
  s.aux2.resize(static_cast<size_t>(len));
  for (int j = 0; j < candidates; ++j) {
    s.aux[static_cast<size_t>(j)] = static_cast<double>(state.score[static_cast<size_t>(j)]) / q;
  }
  internal::MaxPool(s.aux.data(), candidates, kRkvPoolKernel, s.aux2.data());  // importance
  Redundancy(ctx.keys, len, ctx.head_dim, &s.rows, s.aux.data());
  const double lambda = options().lambda;
  s.score.resize(static_cast<size_t>(len));
  for (int j = 0; j < candidates; ++j) {
    s.score[static_cast<size_t>(j)] =
        lambda * s.aux2[static_cast<size_t>(j)] - (1.0 - lambda) * s.aux[static_cast<size_t>(j)];
  }
  internal::KeepTopK(options(), budget, 0, candidates, budget - q, ctx, keep);
  internal::KeepRange(candidates, len, keep);
}

}  // namespace recall::cache::eviction
