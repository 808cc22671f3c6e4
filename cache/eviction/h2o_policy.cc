#include "cache/eviction/h2o_policy.h"

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {

void H2oPolicy::Observe(HeadState* state, const float* p, int len, int t) const {
  RECALL_CHECK(state->size() == len) << "h2o: state has " << state->size() << " slots, len " << len;
  float* score = state->score.data();
  for (int j = 0; j < len; ++j) score[j] += p[j];
}

void H2oPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                           const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "h2o: budget " << budget << " < window";
  RECALL_CHECK(state.size() == len) << "h2o: state/len mismatch";
  keep->clear();
  if (len <= budget) {
    internal::KeepRange(0, len, keep);
    return;
  }
  const int recent_begin = len - options().window;
  std::vector<double>& score = ctx.scratch->score;
  score.resize(static_cast<size_t>(len));
  for (int j = 0; j < recent_begin; ++j) score[static_cast<size_t>(j)] = state.score[static_cast<size_t>(j)];
  internal::KeepTopK(options(), budget, 0, recent_begin, budget - options().window, ctx, keep);
  internal::KeepRange(recent_begin, len, keep);
}

}  // namespace recall::cache::eviction
