#include "cache/eviction/lazy_plus_policy.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "kernels/half.h"

namespace recall::cache::eviction {
namespace {

constexpr float kHalfMax = 65504.0f;  // the largest finite IEEE half: a sum past it saturates

}  // namespace

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
  const float decay = options().attention_decay;
  CompactSlot* slots = state->compact.data();
  const bool clamp = t % kClampEvery == 0;
  for (int j = 0; j < len; ++j) {
    CompactSlot& s = slots[j];
    if (clamp && Age(s, t) > kAgeCap) s.ts = static_cast<uint16_t>(t - kAgeCap);
    const float stored = kernels::F16ToF32(s.sum);
    bool seen = Seen(stored);
    const float e = decay * DecayedAttention(stored) + p[j];
    if (p[j] >= alpha) {
      // The first importance (not yet seen) records no interval.
      if (seen) s.mri = static_cast<uint16_t>(std::max<int>(s.mri, Age(s, t)));
      seen = true;
      s.ts = static_cast<uint16_t>(t);
    }
    s.sum = kernels::F32ToF16(seen ? -std::min(e, kHalfMax) : std::min(e, kHalfMax));
  }
}

float LazyPlusPolicy::Stored(const HeadState& state, int j) {
  return kernels::F16ToF32(state.compact[static_cast<size_t>(j)].sum);
}

double LazyPlusPolicy::AttentionTerm(float stored, int len) const {
  const double r =
      DecayedAttention(stored) * (1.0 - static_cast<double>(options().attention_decay)) * len;
  return options().attention_weight * r / (1.0 + r);
}

double LazyPlusPolicy::SlotScore(const HeadState& state, int j, int len, int t) const {
  const CompactSlot& s = state.compact[static_cast<size_t>(j)];
  return Score(t, t - Age(s, t), s.mri) + AttentionTerm(kernels::F16ToF32(s.sum), len);
}

}  // namespace recall::cache::eviction
