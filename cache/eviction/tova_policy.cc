#include "cache/eviction/tova_policy.h"

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {

void TovaPolicy::Observe(HeadState* state, const float* p, int len, int t) const {
  RECALL_CHECK(state->size() == len) << "tova: state has " << state->size() << " slots, len " << len;
  float* score = state->score.data();
  for (int j = 0; j < len; ++j) score[j] = p[j];
}

void TovaPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                            const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "tova: budget " << budget << " < 1";
  RECALL_CHECK(state.size() == len) << "tova: state/len mismatch";
  keep->clear();
  std::vector<double>& score = ctx.scratch->score;
  score.resize(static_cast<size_t>(len));
  for (int j = 0; j < len; ++j) score[static_cast<size_t>(j)] = state.score[static_cast<size_t>(j)];
  internal::KeepTopK(options(), budget, 0, len, budget, ctx, keep);
}

}  // namespace recall::cache::eviction
