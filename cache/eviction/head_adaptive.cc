#include "cache/eviction/head_adaptive.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace recall::cache::eviction {

void SelectHeadAdaptive(const CandidateSet* heads, int n, int budget, double safeguard,
                        HeadAdaptiveScratch* scratch, std::vector<std::vector<int32_t>>* keeps) {
  RECALL_CHECK(safeguard >= 0.0 && safeguard <= 1.0) << "safeguard " << safeguard;
  keeps->resize(static_cast<size_t>(n));
  std::vector<HeadAdaptiveScratch::Entry>& pool = scratch->pool;
  std::vector<int32_t>& order = scratch->order;
  pool.clear();
  int64_t total_quota = 0;
  int64_t forced = 0;
  for (int h = 0; h < n; ++h) {
    const CandidateSet& c = heads[h];
    std::vector<int32_t>& keep = (*keeps)[static_cast<size_t>(h)];
    keep.assign(c.always.begin(), c.always.end());
    const int quota = c.quota(budget);
    total_quota += quota;
    const int m = c.num_candidates();
    if (m == 0) continue;
    order.resize(static_cast<size_t>(m));
    for (int i = 0; i < m; ++i) order[static_cast<size_t>(i)] = c.begin + i;
    int q = 0;
    if (c.value_protection > 0.0f) {
      q = std::min({quota, m, static_cast<int>(std::floor(c.value_protection * budget))});
      const float* vr = c.value_range.data();
      std::nth_element(order.begin(), order.begin() + q, order.end(), [vr](int32_t a, int32_t b) {
        return vr[a] > vr[b] || (vr[a] == vr[b] && a < b);
      });
    }
    const int s = std::min({static_cast<int>(std::floor(safeguard * quota)), quota - q, m - q});
    const double* sc = c.score.data();
    const auto by_score = [sc](int32_t a, int32_t b) {
      return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
    };
    if (s > 0) std::nth_element(order.begin() + q, order.begin() + q + s, order.end(), by_score);
    keep.insert(keep.end(), order.begin(), order.begin() + q + s);
    forced += q + s;
    for (int i = q + s; i < m; ++i) {
      const int32_t slot = order[static_cast<size_t>(i)];
      pool.push_back({sc[slot], h, slot});
    }
  }
  const int64_t rest = std::max<int64_t>(0, total_quota - forced);
  size_t take = pool.size();
  if (rest < static_cast<int64_t>(pool.size())) {
    take = static_cast<size_t>(rest);
    std::nth_element(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(take), pool.end(),
                     [](const HeadAdaptiveScratch::Entry& a, const HeadAdaptiveScratch::Entry& b) {
                       if (a.score != b.score) return a.score > b.score;
                       if (a.head != b.head) return a.head < b.head;
                       return a.slot < b.slot;
                     });
  }
  for (size_t i = 0; i < take; ++i) {
    (*keeps)[static_cast<size_t>(pool[i].head)].push_back(pool[i].slot);
  }
  for (int h = 0; h < n; ++h) {
    std::sort((*keeps)[static_cast<size_t>(h)].begin(), (*keeps)[static_cast<size_t>(h)].end());
  }
}

}  // namespace recall::cache::eviction
