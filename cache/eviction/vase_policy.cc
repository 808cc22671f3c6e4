#include "cache/eviction/vase_policy.h"

#include <algorithm>
#include <cmath>

#include "cache/eviction/select_util.h"
#include "common/logging.h"

namespace recall::cache::eviction {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double VasePolicy::Uniform(uint64_t seed, const SelectContext& ctx, int slot) {
  uint64_t h = SplitMix64(seed);
  h = SplitMix64(h ^ ctx.session);
  h = SplitMix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(ctx.layer)));
  h = SplitMix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(ctx.head)));
  h = SplitMix64(h ^ static_cast<uint64_t>(ctx.eviction_count));
  h = SplitMix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(slot)));
  // 53 random bits, shifted off 0: (k + 0.5) / 2^53 in (0, 1).
  return (static_cast<double>(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

float VasePolicy::value_quota() const {
  return options().value_protection > 0.0f ? options().value_protection : kVaseValueQuota;
}

void VasePolicy::Observe(HeadState* state, const float* p, int len, int t) const {
  RECALL_CHECK(state->size() == len)
      << "vase: state has " << state->size() << " slots, len " << len;
  float* score = state->score.data();
  if ((t - 1) % options().window == 0) {
    for (int j = 0; j < len; ++j) score[j] = p[j];
  } else {
    for (int j = 0; j < len; ++j) score[j] += p[j];
  }
}

void VasePolicy::SelectKeep(const HeadState& state, int len, int budget, int t,
                            const SelectContext& ctx, std::vector<int32_t>* keep) const {
  RECALL_CHECK(budget >= min_budget()) << "vase: budget " << budget << " < sinks + 1";
  RECALL_CHECK(state.size() == len) << "vase: state/len mismatch";
  RECALL_CHECK(ctx.value_range != nullptr) << "vase: SelectContext::value_range is required";
  keep->clear();
  if (len <= budget) {
    internal::KeepRange(0, len, keep);
    return;
  }
  const int sinks = std::min(options().sinks, len);
  internal::KeepRange(0, sinks, keep);

  // Mean attention per slot over the queries of the current window that saw it.
  const int w = options().window;
  const int window_steps = (t - 1) % w + 1;  // queries observed since the window restarted
  std::vector<double>& mean = ctx.scratch->aux;
  mean.resize(static_cast<size_t>(len));
  for (int j = 0; j < len; ++j) {
    const int seen = std::min(t - state.ts[static_cast<size_t>(j)], window_steps);
    mean[static_cast<size_t>(j)] =
        seen > 0 ? static_cast<double>(state.score[static_cast<size_t>(j)]) / seen : 0.0;
  }
  std::vector<double>& pooled = ctx.scratch->aux2;
  pooled.resize(static_cast<size_t>(len));
  internal::AvgPool(mean.data(), len, kVasePoolKernel, pooled.data());

  // Efraimidis-Spirakis keys; zero weights rank after all positive ones, randomly ordered.
  std::vector<double>& score = ctx.scratch->score;
  score.resize(static_cast<size_t>(len));
  for (int j = sinks; j < len; ++j) {
    const double u = Uniform(options().seed, ctx, j);
    const double wj = pooled[static_cast<size_t>(j)];
    score[static_cast<size_t>(j)] = wj > 0.0 ? std::log(u) / wj : -1e300 * (2.0 - u);
  }
  internal::KeepTopK(value_quota(), budget, sinks, len, budget - sinks, ctx, keep);
}

}  // namespace recall::cache::eviction
