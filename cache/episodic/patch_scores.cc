#include "cache/episodic/patch_scores.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/logging.h"

namespace recall::cache::episodic {

void PatchScores(const float* keys, int base, const float* queries, int p, int n_heads,
                 int first_head, int group, int head_dim, float scale,
                 std::vector<double>* logits, float* score) {
  RECALL_CHECK(p >= 1 && base >= 0) << "patch scores: p " << p << ", base " << base;
  logits->resize(static_cast<size_t>(base + p));
  double* e = logits->data();
  std::fill(score, score + base, 0.0f);
  for (int g = 0; g < group; ++g) {
    for (int i = 0; i < p; ++i) {
      const float* q = queries + (static_cast<int64_t>(i) * n_heads + first_head + g) * head_dim;
      const int visible = base + i + 1;
      double mx = -INFINITY;
      for (int j = 0; j < visible; ++j) {
        const float* k = keys + static_cast<int64_t>(j) * head_dim;
        double dot = 0.0;
        for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        e[j] = dot * scale;
        mx = std::max(mx, e[j]);
      }
      double z = 0.0;
      for (int j = 0; j < visible; ++j) {
        e[j] = std::exp(e[j] - mx);
        z += e[j];
      }
      for (int j = 0; j < base; ++j) score[j] = std::max(score[j], static_cast<float>(e[j] / z));
    }
  }
}

void KeepTop(const float* score, int n, int budget, std::vector<int32_t>* order,
             std::vector<int32_t>* keep) {
  keep->clear();
  if (n <= budget) {
    for (int j = 0; j < n; ++j) keep->push_back(j);
    return;
  }
  order->resize(static_cast<size_t>(n));
  std::iota(order->begin(), order->end(), 0);
  const auto better = [score](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  };
  std::nth_element(order->begin(), order->begin() + budget, order->end(), better);
  keep->assign(order->begin(), order->begin() + budget);
  std::sort(keep->begin(), keep->end());
}

void KeepTopAcrossHeads(const std::vector<const float*>& scores, const std::vector<int>& lens,
                        int64_t total, std::vector<std::vector<int32_t>>* keeps) {
  const size_t heads = scores.size();
  RECALL_CHECK(lens.size() == heads) << "one length per head";
  struct Entry {
    float score;
    int32_t head;
    int32_t slot;
  };
  std::vector<Entry> all;
  for (size_t h = 0; h < heads; ++h) {
    for (int j = 0; j < lens[h]; ++j) all.push_back({scores[h][j], static_cast<int32_t>(h), j});
  }
  keeps->assign(heads, {});
  const auto better = [](const Entry& a, const Entry& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.head != b.head) return a.head < b.head;
    return a.slot < b.slot;
  };
  const int64_t k = std::min<int64_t>(total, static_cast<int64_t>(all.size()));
  if (k < static_cast<int64_t>(all.size())) {
    std::nth_element(all.begin(), all.begin() + k, all.end(), better);
  }
  for (int64_t i = 0; i < k; ++i) (*keeps)[all[i].head].push_back(all[i].slot);
  for (std::vector<int32_t>& keep : *keeps) std::sort(keep.begin(), keep.end());
}

}  // namespace recall::cache::episodic
