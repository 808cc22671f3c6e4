#include "kernels/cpu/lazy_evict.h"

#include <algorithm>
#include <numeric>

#include "common/logging.h"
#include "kernels/lazy_score.h"

namespace recall::kernels::cpu {

void LazyKeepList(const int32_t* ts, const int32_t* mri, int len, int keep, int window, int t,
                  LazyKeepScratch* scratch, int32_t* out) {
  RECALL_CHECK(window >= 0 && window <= keep && keep < len)
      << "LazyKeepList: needs window " << window << " <= keep " << keep << " < len " << len;
  const int n = len - window, k = keep - window;
  std::vector<int32_t>* order = &scratch->order;
  std::vector<double>& score = scratch->score;
  order->resize(static_cast<size_t>(n));
  std::iota(order->begin(), order->end(), 0);
  score.resize(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) score[static_cast<size_t>(j)] = LazyScore(t, ts[j], mri[j]);
  const auto better = [&](int32_t a, int32_t b) {
    const double sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  };
  std::nth_element(order->begin(), order->begin() + k, order->end(), better);
  std::sort(order->begin(), order->begin() + k);
  std::copy(order->begin(), order->begin() + k, out);
  std::iota(out + k, out + keep, n);
}

void CompactInts(int32_t* x, const int32_t* keep, int n) {
  for (int i = 0; i < n; ++i) x[i] = x[keep[i]];
}

}  // namespace recall::kernels::cpu
