#include "cache/eviction/lazy_policy.h"

#include <algorithm>

#include "cache/eviction/select_util.h"
#include "common/logging.h"
#include "kernels/lazy_score.h"

namespace recall::cache::eviction {

double LazyPolicy::Score(int t, int32_t ts, int32_t mri) { return kernels::LazyScore(t, ts, mri); }

void LazyPolicy::Observe(HeadState* state, const float* p, int len, int t) const {
  RECALL_CHECK(state->size() == len) << "lazy: state has " << state->size() << " slots, len " << len;
  const float alpha = options().alpha;
  int32_t* ts = state->ts.data();
  int32_t* mri = state->mri.data();
  for (int j = 0; j < len; ++j) {
    if (p[j] >= alpha) {
      mri[j] = std::max(mri[j], t - ts[j]);
      ts[j] = t;
    }
  }
}

double LazyPolicy::SlotScore(const HeadState& state, int j, int /*len*/, int t) const {
  return Score(t, state.ts[static_cast<size_t>(j)], state.mri[static_cast<size_t>(j)]);
}

void LazyPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                            const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "lazy: budget " << budget << " < window";
  RECALL_CHECK(state.size() == len) << "lazy: state/len mismatch";
  keep->clear();
  if (len <= budget) {
    internal::KeepRange(0, len, keep);
    return;
  }
  const int window_begin = len - options().window;
  std::vector<double>& score = ctx.scratch->score;
  score.resize(static_cast<size_t>(len));
  for (int j = 0; j < window_begin; ++j)
    score[static_cast<size_t>(j)] = SlotScore(state, j, len, t);
  internal::KeepTopK(options(), budget, 0, window_begin, budget - options().window, ctx, keep);
  internal::KeepRange(window_begin, len, keep);
}

}  // namespace recall::cache::eviction
