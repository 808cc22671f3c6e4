#include "cache/eviction/lazy_plus_policy.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace recall::cache::eviction {

double LazyPlusPolicy::Score(int t, int32_t ts, int32_t mri) {
  const double since = static_cast<double>(t) - ts;
  const double h1 = 2.0 / (1.0 + std::exp(1.0 + since / std::max(mri, 1)));
  const double h2 =
      mri > 0 ? 2.0 / (1.0 + std::exp(std::max(static_cast<double>(mri), since) - 1.0)) : 0.0;
  return h1 + h2;
}

void LazyPlusPolicy::Observe(HeadState* state, const float* p, int len, int t) const {
  RECALL_CHECK(state->size() == len)
      << "lazy+: state has " << state->size() << " slots, len " << len;
  const float alpha = options().alpha_uniform > 0.0f
                          ? options().alpha_uniform / static_cast<float>(len)
                          : options().alpha;
  int32_t* ts = state->ts.data();
  int32_t* mri = state->mri.data();
  const float decay = options().attention_decay;
  float* stored = state->score.data();
  for (int j = 0; j < len; ++j) {
    bool seen = Seen(stored[j]);
    const float e = decay * DecayedAttention(stored[j]) + p[j];
    if (p[j] >= alpha) {
      // The first importance (not yet seen) records no interval.
      if (seen) mri[j] = std::max(mri[j], t - ts[j]);
      seen = true;
      ts[j] = t;
    }
    stored[j] = seen ? -e : e;
  }
}

double LazyPlusPolicy::AttentionTerm(float stored, int len) const {
  const double r =
      DecayedAttention(stored) * (1.0 - static_cast<double>(options().attention_decay)) * len;
  return options().attention_weight * r / (1.0 + r);
}

double LazyPlusPolicy::SlotScore(const HeadState& state, int j, int len, int t) const {
  const auto s = static_cast<size_t>(j);
  return Score(t, state.ts[s], state.mri[s]) + AttentionTerm(state.score[s], len);
}

}  // namespace recall::cache::eviction
