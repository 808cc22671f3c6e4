// LazyPlusPolicy ("lazy+"): LazyEviction without its blind spot (EVICTION.md section 1).
//
// The released rule ("lazy", lazy_policy.h) gives a token mri = 1, hence H2 = 1 for good, when
// it is important at two consecutive steps, which happens to every new token that attends to
// itself above alpha at its first step and to every prompt token first important at step 1;
// a token that genuinely recurs every 3 or more steps scores at most about 0.78, so tokens
// that mattered once outrank the recurring ones. lazy+ changes five things, and nothing else
// (same protected window of W, same threshold alpha, same ties):
//  1. A slot's first importance is not a recurrence: it sets ts = t and marks the slot seen
//     (the sign bit of its attention sum, see 5) without touching mri. mri grows only from the
//     second importance on, i.e. only across an interval between two importances.
//  2. H2 is taken on the effective interval m = max(mri, t - ts): a token that has not been
//     important for longer than its recorded interval has, by now, a recurrence interval at
//     least that long. The prior decays for tokens that stopped recurring and stays for those
//     that go on (a sink important at every step keeps m = 1 and H2 = 1).
//  3. H1 divides by max(mri, 1) instead of mri + 1e-5: a token important so far at one run of
//     steps only (mri = 0) is not 0 one step later but fades over a few steps, so such tokens
//     are ranked by how recently they mattered instead of by age (the tie rule), which would
//     keep the oldest of them and drop the one that just left the window.
//   H1 = 2 / (1 + exp(1 + (t - ts) / max(mri, 1)))
//   H2 = mri > 0 ? 2 / (1 + exp(max(mri, t - ts) - 1)) : 0
//  4. From step W on it evicts at every step over budget, not every W steps: a new token
//     still has its W steps in the protected window before it is judged, but the cache holds
//     C all the time instead of swinging between C and C + W, so its peak is the budget
//     (lazy's is C + W) once the prompt has been judged. The first eviction waits for step W,
//     as lazy's does, so a prompt longer than the budget is judged on W steps of attention,
//     not one (evicting at step 1 halved the greedy agreement on 384-token prompts).
//  5. The score also weighs how much attention the slot drew lately, not only when it crossed
//     the threshold: e <- decay * e + p_j at every step (the slot's sum holds e, its sign
//     bit the "seen" flag of 1), and S = H1 + H2 + weight * r / (1 + r) with r = e * (1 - decay) *
//     len, the recent attention as a multiple of the uniform share. The threshold makes a slot
//     at 1.01 and at 50 times alpha equal, and between importances H1 and H2 know only the
//     timing; measured on stories260K, this term is most of lazy+'s gain at a 20-40% peak
//     (docs/eviction.md). PolicyOptions::attention_weight = 0 gives the rule of 1-4 alone.
// With PolicyOptions::alpha_uniform = k > 0 the threshold is k / len (k times the uniform
// share of the cached slots) instead of alpha: measured on stories260K, one k suits every
// budget, where the best absolute alpha falls as the budget grows (docs/eviction.md).
// As 4 makes the protected window cost no memory, W can be larger than lazy's: on
// stories260K, before 5, the best W grew with the budget (32 at a 20% peak, 48 at 30%, 64 at
// 40-50%; with 5 it matters less, docs/eviction.md). The window is not derived from the budget,
// because SessionEvictor's two-phase selection (head-adaptive budgets, CAOTE) needs the always-kept
// slots to be the same at every budget. It runs on the host path on every device (no backend step).
//
// State: 6 bytes per slot (HeadState::compact, a CompactSlot), half of lazy's 8 + 4, because it
// is memory the session holds beside each slot's K and V (EVICTION.md section 6): ts modulo
// 2^16, mri in 16 bits and e as an IEEE half (11 significant bits; e is at most 1 / (1 -
// decay)). The age t - ts is read modulo 2^16; so that it never wraps, every 16384 steps an
// age past 32768 is set back to 32768: a slot not important for more than 32768 steps reads
// as 32768 to 49151 steps old (mri, taken from ages, then stays below 49152). Below that
// age the clocks are exact.
#pragma once

#include <cmath>

#include "cache/eviction/lazy_policy.h"

namespace recall::cache::eviction {

class LazyPlusPolicy final : public LazyPolicy {
 public:
  explicit LazyPlusPolicy(const PolicyOptions& options) : LazyPolicy(options) {}
  absl::string_view name() const override { return "lazy+"; }
  uint32_t state_arrays() const override { return kCompactSlotArray; }
  bool has_backend_step() const override { return false; }
  void Observe(HeadState* state, const float* p, int len, int t) const override;
  bool ShouldEvict(int len, int budget, int t) const override {
    return len > budget && t >= options().window;
  }
  int eviction_lag() const override { return options().window; }

  // The recurrence score H1 + H2 of 1-3 (without the attention term of 5).
  static double Score(int t, int32_t ts, int32_t mri);
  // The attention term of 5 for a slot whose stored sum is `stored`, in [0, weight).
  double AttentionTerm(float stored, int len) const;
  // The stored sum's two parts: the decayed attention sum, and whether the slot has been
  // important (the sign bit).
  static float DecayedAttention(float stored) { return std::fabs(stored); }
  static bool Seen(float stored) { return std::signbit(stored); }

  // Slot j of `state` at step t (as of its last Observe): the step of its last importance
  // (t - age), its recurrence interval and its stored sum (widened to float).
  static int LastImportant(const HeadState& state, int j, int t) {
    return t - Age(state.compact[static_cast<size_t>(j)], t);
  }
  static int Interval(const HeadState& state, int j) {
    return state.compact[static_cast<size_t>(j)].mri;
  }
  static float Stored(const HeadState& state, int j);
  // Steps between which ages past kAgeCap are set back to it (see above).
  static constexpr int kClampEvery = 16384, kAgeCap = 32768;

 protected:
  double SlotScore(const HeadState& state, int j, int len, int t) const override;

 private:
  static int Age(const CompactSlot& s, int t) { return (t - s.ts) & 0xffff; }
};

}  // namespace recall::cache::eviction
