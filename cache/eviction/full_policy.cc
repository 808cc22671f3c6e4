#include "cache/eviction/full_policy.h"

#include "cache/eviction/select_util.h"

namespace recall::cache::eviction {

void FullKvPolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                              const SelectContext& ctx, std::vector<int32_t>* keep) const {
  keep->clear();
  internal::KeepRange(0, len, keep);
}

}  // namespace recall::cache::eviction
