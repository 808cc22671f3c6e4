#include "cache/eviction/streaming_policy.h"

#include <algorithm>

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {

void StreamingPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                                 const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "streaming: budget " << budget << " < sinks + 1";
  keep->clear();
  if (len <= budget) {
    internal::KeepRange(0, len, keep);
    return;
  }
  const int sinks = std::min(options().sinks, len);
  internal::KeepRange(0, sinks, keep);
  // Recency is the score: a newer slot ranks higher.
  std::vector<double>& score = ctx.scratch->score;
  score.resize(static_cast<size_t>(len));
  for (int j = sinks; j < len; ++j) score[static_cast<size_t>(j)] = j;
  internal::KeepTopK(options(), budget, sinks, len, budget - sinks, ctx, keep);
}

}  // namespace recall::cache::eviction
