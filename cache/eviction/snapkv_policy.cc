#include "cache/eviction/snapkv_policy.h"

#include <algorithm>
#include <cmath>

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {

void SnapKvPolicy::WindowScores(const float* keys, int len, const float* queries, int w,
                                int n_heads, int first_head, int group, int head_dim, float scale,
                                SelectScratch* scratch, float* score) {
  RECALL_CHECK(w >= 1 && w <= len) << "snapkv: window " << w << " not in [1, " << len << "]";
  const int candidates = len - w;
  std::vector<double>& logits = scratch->aux;    // [len]
  std::vector<double>& acc = scratch->aux2;      // [candidates]
  std::vector<double>& pooled = scratch->score;  // [candidates]
  logits.resize(static_cast<size_t>(len));
  acc.resize(static_cast<size_t>(candidates));
  pooled.resize(static_cast<size_t>(candidates));
  std::fill(score, score + candidates, 0.0f);
  for (int g = 0; g < group; ++g) {
    const int qh = first_head + g;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int i = 0; i < w; ++i) {
      const float* q = queries + (static_cast<int64_t>(i) * n_heads + qh) * head_dim;
      const int visible = candidates + i + 1;
      double mx = -INFINITY;
      for (int j = 0; j < visible; ++j) {
        const float* k = keys + static_cast<int64_t>(j) * head_dim;
        double dot = 0.0;
        for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        logits[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, logits[static_cast<size_t>(j)]);
      }
      double z = 0.0;
      for (int j = 0; j < visible; ++j) {
        logits[static_cast<size_t>(j)] = std::exp(logits[static_cast<size_t>(j)] - mx);
        z += logits[static_cast<size_t>(j)];
      }
      for (int j = 0; j < candidates; ++j)
        acc[static_cast<size_t>(j)] += logits[static_cast<size_t>(j)] / z;
    }
    internal::AvgPool(acc.data(), candidates, kSnapKvPoolKernel, pooled.data());
    for (int j = 0; j < candidates; ++j) {
      score[j] += static_cast<float>(pooled[static_cast<size_t>(j)] / group);
    }
  }
}

void SnapKvPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                              const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "snapkv: budget " << budget << " < window";
  RECALL_CHECK(state.size() == len) << "snapkv: state/len mismatch";
  keep->clear();
  if (len <= budget) {
    internal::KeepRange(0, len, keep);
    return;
  }
  const int w = std::min(options().window, len);
  const int candidates = len - w;
  std::vector<double>& score = ctx.scratch->score;
  score.resize(static_cast<size_t>(len));
  for (int j = 0; j < candidates; ++j)
    score[static_cast<size_t>(j)] = state.score[static_cast<size_t>(j)];
  internal::KeepTopK(options(), budget, 0, candidates, budget - w, ctx, keep);
  internal::KeepRange(candidates, len, keep);
}

}  // namespace recall::cache::eviction
