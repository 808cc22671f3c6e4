#include "cache/eviction/select_util.h"

#include <algorithm>
#include <cmath>

#include "cache/eviction/candidate_set.h"
#include "common/logging.h"

namespace recall::cache::eviction::internal {

void KeepTopK(const PolicyOptions& options, int budget, int begin, int end, int k,
              const SelectContext& ctx, std::vector<int32_t>* keep) {
  KeepTopK(options.value_protection, budget, begin, end, k, ctx, keep);
}

void KeepTopK(float value_protection, int budget, int begin, int end, int k,
              const SelectContext& ctx, std::vector<int32_t>* keep) {
  RECALL_CHECK(ctx.scratch != nullptr) << "SelectContext::scratch is required";
  RECALL_CHECK(0 <= begin && begin <= end) << "bad candidate range";
  if (ctx.capture != nullptr) {
    CaptureCandidates(value_protection, begin, end, ctx);
    return;
  }
  const int n = end - begin;
  if (k <= 0) return;
  if (k >= n) {
    KeepRange(begin, end, keep);
    return;
  }
  SelectScratch& s = *ctx.scratch;
  RECALL_CHECK(static_cast<int>(s.score.size()) >= end) << "scratch score too small";
  s.order.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) s.order[static_cast<size_t>(i)] = begin + i;

  int q = 0;
  if (value_protection > 0.0f && ctx.value_range != nullptr) {
    q = std::min(k, static_cast<int>(std::floor(value_protection * budget)));
  }
  if (q > 0) {
    const float* vr = ctx.value_range;
    std::nth_element(s.order.begin(), s.order.begin() + q, s.order.end(),
                     [vr](int32_t a, int32_t b) {
                       return vr[a] > vr[b] || (vr[a] == vr[b] && a < b);
                     });
  }
  if (k > q) {
    const double* sc = s.score.data();
    std::nth_element(s.order.begin() + q, s.order.begin() + k, s.order.end(),
                     [sc](int32_t a, int32_t b) {
                       return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
                     });
  }
  const size_t first = keep->size();
  keep->insert(keep->end(), s.order.begin(), s.order.begin() + k);
  std::sort(keep->begin() + static_cast<std::ptrdiff_t>(first), keep->end());
}

void KeepRange(int begin, int end, std::vector<int32_t>* keep) {
  for (int j = begin; j < end; ++j) keep->push_back(j);
}

void AvgPool(const double* x, int n, int kernel, double* out) {
  const int r = kernel / 2;
  for (int j = 0; j < n; ++j) {
    double sum = 0.0;
    for (int i = std::max(0, j - r); i <= std::min(n - 1, j + r); ++i) sum += x[i];
    out[j] = sum / kernel;
  }
}

void MaxPool(const double* x, int n, int kernel, double* out) {
  const int r = kernel / 2;
  for (int j = 0; j < n; ++j) {
    double m = x[j];
    for (int i = std::max(0, j - r); i <= std::min(n - 1, j + r); ++i) m = std::max(m, x[i]);
    out[j] = m;
  }
}

}  // namespace recall::cache::eviction::internal
