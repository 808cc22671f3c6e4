#include "worker/serving/tp_ranks.h"

namespace recall::serving {

SchedulerRanks SchedulerRanksOf(runtime::tp::TpGroup& group) {
  SchedulerRanks ranks;
  for (int r = 0; r < group.tp(); ++r) {
    SchedulerRank rank;
    rank.forward = &group.forward(r);
    rank.pool = &group.pool(r);
    rank.comm = group.tp() > 1 ? &group.comm(r) : nullptr;
    rank.kv_head_offset = group.layout(r).kv_head_offset;
    ranks.ranks.push_back(rank);
  }
  ranks.total_kv_heads = group.full_model().config.n_kv_heads;
  if (group.tp() > 1) {
    ranks.run_all = [&group](const std::function<absl::Status(int)>& fn) { return group.Run(fn); };
  }
  return ranks;
}

SchedulerRanks SchedulerRanksOf(runtime::Engine& engine) {
  if (engine.group() != nullptr) return SchedulerRanksOf(*engine.group());
  SchedulerRanks ranks;
  ranks.ranks.push_back({&engine.forward(0), &engine.pool(0), nullptr, 0});
  ranks.total_kv_heads = engine.model().config.n_kv_heads;
  return ranks;
}

}  // namespace recall::serving
