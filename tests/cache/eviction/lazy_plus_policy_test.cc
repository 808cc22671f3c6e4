// lazy+ (lazy_plus_policy.h): LazyEviction without the blind spot of its released rule. The
// scenario of EVICTION.md section 1 is played through both policies: a token that mattered
// only at its first steps outranks a genuinely recurring one under "lazy" and not under
// "lazy+"; a token important at every step keeps its full prior under both; lazy+ evicts at
// every step over budget, so its cache peaks at the budget; its attention term ranks slots of
// the same timing by the attention they drew.
#include "cache/eviction/lazy_plus_policy.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

// The relative error of three roundings to an IEEE half (11 significant bits).
constexpr float kHalfStep = 3.0f / 2048;

PolicyOptions Options(const char* name, int window, float alpha) {
  PolicyOptions o;
  o.name = name;
  o.window = window;
  o.alpha = alpha;
  return o;
}

// Scenario: alpha = 0.1; slot 0 a prompt token, slot 1 decoded at step 1 (seen from step 2).
TEST(LazyPlusPolicyTest, AFirstImportanceIsNotARecurrence) {
  LazyPlusPolicy plus(Options("lazy+", 4, 0.1f));
  LazyPolicy lazy(Options("lazy", 4, 0.1f));
  HeadState a, b;
  AppendSlots(&a, 1, 1);
  AppendSlots(&b, 1, 1);
  const float p1[1] = {0.5f};  // the prompt token is first important at step 1
  plus.Observe(&a, p1, 1, 1);
  lazy.Observe(&b, p1, 1, 1);
  EXPECT_EQ(LazyPlusPolicy::Interval(a, 0), 0) << "lazy+: no interval yet";
  EXPECT_EQ(LazyPlusPolicy::LastImportant(a, 0, 1), 1);
  EXPECT_EQ(b.mri[0], 1) << "lazy counts step 0 -> 1 as a recurrence";
  AppendSlots(&a, 1, 2);
  const float p2[2] = {0.0f, 0.3f};  // the new token attends to itself at its first step
  plus.Observe(&a, p2, 2, 2);
  EXPECT_EQ(LazyPlusPolicy::Interval(a, 1), 0);
  const float p5[2] = {0.2f, 0.0f};  // the prompt token recurs 4 steps later
  plus.Observe(&a, p5, 2, 5);
  EXPECT_EQ(LazyPlusPolicy::Interval(a, 0), 4);
  EXPECT_EQ(LazyPlusPolicy::LastImportant(a, 0, 5), 5);
}

// Hand-computed (Python, double): H1 divides by max(mri, 1), H2 is taken on max(mri, t - ts).
TEST(LazyPlusPolicyTest, ThePriorDecaysOnceATokenStopsRecurring) {
  // Important at two consecutive steps, last at step 2, now t = 40: lazy keeps H2 = 1.
  EXPECT_NEAR(LazyPolicy::Score(40, 2, 1), 1.0, 1e-12);
  // lazy+: H1 = 2 / (1 + exp(1 + 38)) = 2.3e-17, H2 = 2 / (1 + exp(37)) = 1.7e-16.
  EXPECT_NEAR(LazyPlusPolicy::Score(40, 2, 1), 1.9375740086e-16, 1e-24);
  // Important at every step (a sink): the same as lazy, H1 + H2 = 0.538 + 1.
  EXPECT_NEAR(LazyPlusPolicy::Score(40, 40, 1), 1.53788284273999, 1e-12);
  // Recurring every 4 steps, last important 2 steps ago: H1 = 2 / (1 + exp(1 + 2 / 4))
  // = 0.364851, H2 = 2 / (1 + exp(3)) = 0.094852: within its interval as under lazy.
  EXPECT_NEAR(LazyPlusPolicy::Score(40, 38, 4), 0.459702793967846, 1e-12);
  EXPECT_NEAR(LazyPlusPolicy::Score(40, 38, 4), LazyPolicy::Score(40, 38, 4), 1e-5);
  // Important once, 3 steps ago (mri = 0): lazy scores 0; lazy+ ranks such tokens by how
  // recently they were important, H1 = 2 / (1 + exp(1 + 3)) = 0.035972, H2 = 0.
  EXPECT_EQ(LazyPolicy::Score(40, 37, 0), 0.0);
  EXPECT_NEAR(LazyPlusPolicy::Score(40, 37, 0), 0.0359724199241831, 1e-12);
}

// Scenario (EVICTION.md section 1's blind spot): W = 4, alpha = 0.1, budget C = 5 (one
// candidate place beside the window). Slot 0 is important at steps 1 and 2 only; slot 1 is
// important at steps 1, 5, 9, ..., 37 (every 4 steps); slots 2..5 are never important.
// At t = 40 lazy keeps slot 0 (mri = 1: S = 1 for good) and loses the recurring slot 1;
// lazy+ keeps slot 1.
TEST(LazyPlusPolicyTest, KeepsTheRecurringTokenOverTheOnceImportantOne) {
  for (const char* name : {"lazy", "lazy+"}) {
    const PolicyOptions o = Options(name, 4, 0.1f);
    auto policy = CreatePolicy(o);
    ASSERT_TRUE(policy.ok()) << policy.status();
    HeadState s;
    AppendSlots(&s, 6, 1);
    for (int t = 1; t <= 40; ++t) {
      float p[6] = {0, 0, 0, 0, 0, 0};
      if (t <= 2) p[0] = 0.5f;
      if ((t - 1) % 4 == 0) p[1] = 0.5f;
      (*policy)->Observe(&s, p, 6, t);
    }
    SelectScratch scratch;
    SelectContext ctx;
    ctx.scratch = &scratch;
    std::vector<int32_t> keep;
    ASSERT_TRUE((*policy)->ShouldEvict(6, 5, 40));
    (*policy)->SelectKeep(s, 6, 5, 40, ctx, &keep);
    const std::vector<int32_t> want = std::string(name) == "lazy"
                                          ? std::vector<int32_t>{0, 2, 3, 4, 5}
                                          : std::vector<int32_t>{1, 2, 3, 4, 5};
    EXPECT_EQ(keep, want) << name;
  }
}

// W = 4, C = 8: lazy evicts only at multiples of W (peak C + W); lazy+ waits W steps (the
// prompt is judged on W steps of attention, as under lazy) and then evicts at every step over C.
// With alpha_uniform = k, a slot is important iff p >= k / len: the same attention counts in a
// short cache only if it is k times that cache's uniform share, and counts in a long one.
TEST(LazyPlusPolicyTest, AnAlphaRelativeToTheUniformShareFollowsTheCacheLength) {
  PolicyOptions o = Options("lazy+", 4, 0.9f);  // an absolute alpha nothing here reaches
  o.alpha_uniform = 2.0f;
  ASSERT_TRUE(CreatePolicy(o).ok());
  LazyPlusPolicy plus(o);
  HeadState shrt, lng;
  AppendSlots(&shrt, 4, 1);
  AppendSlots(&lng, 40, 1);
  std::vector<float> p4 = {0.45f, 0.55f, 0.0f, 0.0f};  // 2 / 4 = 0.5
  plus.Observe(&shrt, p4.data(), 4, 1);
  EXPECT_EQ(LazyPlusPolicy::LastImportant(shrt, 0, 1), 0) << "0.45 < 2 / 4: not important";
  EXPECT_EQ(LazyPlusPolicy::LastImportant(shrt, 1, 1), 1);
  std::vector<float> p40(40, 0.0f);
  p40[0] = 0.06f;  // >= 2 / 40 = 0.05
  p40[1] = 0.04f;
  plus.Observe(&lng, p40.data(), 40, 1);
  EXPECT_EQ(LazyPlusPolicy::LastImportant(lng, 0, 1), 1);
  EXPECT_EQ(LazyPlusPolicy::LastImportant(lng, 1, 1), 0);
  // Only lazy+ takes it, and not a negative one.
  o.name = "lazy";
  EXPECT_EQ(CreatePolicy(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.name = "lazy+";
  o.alpha_uniform = -1.0f;
  EXPECT_EQ(CreatePolicy(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LazyPlusPolicyTest, EvictsAtEveryStepOverBudgetFromStepW) {
  LazyPlusPolicy plus(Options("lazy+", 4, 1e-4f));
  LazyPolicy lazy(Options("lazy", 4, 1e-4f));
  for (int t = 1; t <= 12; ++t) {
    EXPECT_EQ(plus.ShouldEvict(9, 8, t), t >= 4) << "t=" << t;
    EXPECT_FALSE(plus.ShouldEvict(8, 8, t)) << "t=" << t;
    EXPECT_EQ(lazy.ShouldEvict(9, 8, t), t % 4 == 0) << "t=" << t;
  }
}

// The decayed attention sum, e <- 0.9 e + p at every step (kept as an IEEE half: within a
// rounding of 2^-11 for each step that stored it), and the "seen" sign bit.
TEST(LazyPlusPolicyTest, KeepsADecayedAttentionSumAndASeenFlag) {
  PolicyOptions o = Options("lazy+", 4, 0.1f);
  LazyPlusPolicy plus(o);
  HeadState s;
  AppendSlots(&s, 2, 1);
  const float p1[2] = {0.05f, 0.5f};  // slot 0 below alpha, slot 1 important
  plus.Observe(&s, p1, 2, 1);
  EXPECT_FALSE(LazyPlusPolicy::Seen(LazyPlusPolicy::Stored(s, 0)));
  EXPECT_TRUE(LazyPlusPolicy::Seen(LazyPlusPolicy::Stored(s, 1)));
  EXPECT_NEAR(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(s, 0)), 0.05f,
              0.05f * kHalfStep);
  EXPECT_NEAR(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(s, 1)), 0.5f,
              0.5f * kHalfStep);
  const float p2[2] = {0.0f, 0.0f};
  plus.Observe(&s, p2, 2, 2);
  EXPECT_NEAR(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(s, 0)), 0.045f,
              0.045f * kHalfStep);
  EXPECT_NEAR(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(s, 1)), 0.45f,
              0.45f * kHalfStep);
  EXPECT_TRUE(LazyPlusPolicy::Seen(LazyPlusPolicy::Stored(s, 1))) << "seen stays set";
  const float p3[2] = {0.2f, 0.0f};
  plus.Observe(&s, p3, 2, 3);
  EXPECT_NEAR(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(s, 0)), 0.2405f,
              0.2405f * kHalfStep);
  EXPECT_EQ(LazyPlusPolicy::Interval(s, 0), 0) << "its first importance";
  EXPECT_EQ(LazyPlusPolicy::LastImportant(s, 0, 3), 3);
  // Compaction carries both parts with the slot.
  CompactState(&s, {1});
  EXPECT_TRUE(LazyPlusPolicy::Seen(LazyPlusPolicy::Stored(s, 0)));
  EXPECT_NEAR(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(s, 0)), 0.405f,
              0.405f * kHalfStep);
  // With alpha 0 every slot is important at once, even with no attention (stored -0.0).
  o.alpha = 0.0f;
  LazyPlusPolicy zero(o);
  HeadState z;
  AppendSlots(&z, 1, 1);
  const float p0[1] = {0.0f};
  zero.Observe(&z, p0, 1, 1);
  EXPECT_TRUE(LazyPlusPolicy::Seen(LazyPlusPolicy::Stored(z, 0)));
  EXPECT_EQ(LazyPlusPolicy::DecayedAttention(LazyPlusPolicy::Stored(z, 0)), 0.0f);
}

// weight * r / (1 + r), r = e * (1 - decay) * len; hand-computed.
TEST(LazyPlusPolicyTest, TheAttentionTermIsTheRecentAttentionOverTheUniformShare) {
  PolicyOptions o = Options("lazy+", 4, 0.1f);
  o.attention_decay = 0.9f;
  o.attention_weight = 3.0f;
  LazyPlusPolicy plus(o);
  // e = 1, 6 slots: r = 1 * 0.1 * 6 = 0.6 (up to 0.9f's rounding), term = 3 * 0.6 / 1.6.
  EXPECT_NEAR(plus.AttentionTerm(-1.0f, 6), 1.125, 1e-6);
  EXPECT_NEAR(plus.AttentionTerm(1.0f, 6), 1.125, 1e-6) << "the seen flag does not count";
  EXPECT_EQ(plus.AttentionTerm(0.0f, 6), 0.0);
  // A slot that always draws the uniform share 1 / len has e -> 1 / (len * 0.1), r -> 1.
  EXPECT_NEAR(plus.AttentionTerm(1.0f / (6 * 0.1f), 6), 1.5, 1e-6);
  o.attention_weight = 0.0f;
  EXPECT_EQ(LazyPlusPolicy(o).AttentionTerm(-1.0f, 6), 0.0);
}

// W = 2, C = 3: two candidates (slots 0 and 1) for one place. Both are important at the same
// steps (the same ts and mri), slot 1 with far more attention. The recurrence score ties
// them, and the tie keeps the older slot 0; the attention term keeps slot 1. Weight 0 gives
// the recurrence score alone.
TEST(LazyPlusPolicyTest, TheAttentionTermKeepsTheSlotThatDrewMoreAttention) {
  for (const float weight : {3.0f, 0.0f}) {
    PolicyOptions o = Options("lazy+", 2, 0.1f);
    o.attention_weight = weight;
    LazyPlusPolicy plus(o);
    HeadState s;
    AppendSlots(&s, 4, 1);
    for (int t = 1; t <= 6; ++t) {
      const float p[4] = {0.12f, 0.8f, 0.04f, 0.04f};
      plus.Observe(&s, p, 4, t);
    }
    ASSERT_EQ(LazyPlusPolicy::LastImportant(s, 0, 6), LazyPlusPolicy::LastImportant(s, 1, 6));
    ASSERT_EQ(LazyPlusPolicy::Interval(s, 0), LazyPlusPolicy::Interval(s, 1));
    SelectScratch scratch;
    SelectContext ctx;
    ctx.scratch = &scratch;
    std::vector<int32_t> keep;
    plus.SelectKeep(s, 4, 3, 6, ctx, &keep);
    const std::vector<int32_t> want =
        weight > 0 ? std::vector<int32_t>{1, 2, 3} : std::vector<int32_t>{0, 2, 3};
    EXPECT_EQ(keep, want) << "weight " << weight;
  }
}

TEST(LazyPlusPolicyTest, RefusesAnAttentionDecayOrWeightOutOfRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float decay : {-0.1f, 1.0f, nan}) {
    PolicyOptions o = Options("lazy+", 4, 0.1f);
    o.attention_decay = decay;
    const absl::Status s = CreatePolicy(o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << decay;
    EXPECT_NE(s.message().find("attention_decay must be in [0, 1)"), absl::string_view::npos) << s;
  }
  for (const float weight : {-1.0f, 2e6f, nan}) {
    PolicyOptions o = Options("lazy+", 4, 0.1f);
    o.attention_weight = weight;
    const absl::Status s = CreatePolicy(o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << weight;
    EXPECT_NE(s.message().find("attention_weight must be in [0, 1e6]"), absl::string_view::npos)
        << s;
  }
}

// The clocks are 16 bits: a slot's last importance reads exactly across the wrap of 2^16
// steps, and an age past 32768 steps is held between 32768 and 49151 so that it never wraps.
TEST(LazyPlusPolicyTest, SixteenBitClocksReadExactlyAcrossTheirWrap) {
  LazyPlusPolicy plus(Options("lazy+", 4, 0.1f));
  HeadState s(plus.state_arrays());
  AppendSlots(&s, 3, 1);
  EXPECT_EQ(s.bytes(), static_cast<int64_t>(s.compact.capacity() * 6)) << "6 bytes a slot";
  const int last = 140000;
  for (int t = 1; t <= last; ++t) {
    // Slot 0: important at steps 1 and 2 only; slot 1: every 1000 steps; slot 2: at step
    // 130000 for the first time, and at 139000 again.
    const float p[3] = {t <= 2 ? 0.5f : 0.0f, t % 1000 == 0 ? 0.5f : 0.0f,
                        t == 130000 || t == 139000 ? 0.5f : 0.0f};
    plus.Observe(&s, p, 3, t);
    if (t == 70000) {
      EXPECT_EQ(LazyPlusPolicy::LastImportant(s, 1, t), 70000);
      EXPECT_EQ(LazyPlusPolicy::Interval(s, 1), 1000);
    }
  }
  const int age0 = last - LazyPlusPolicy::LastImportant(s, 0, last);
  EXPECT_GE(age0, LazyPlusPolicy::kAgeCap) << "a slot silent since step 2 is old, not new";
  EXPECT_LT(age0, LazyPlusPolicy::kAgeCap + LazyPlusPolicy::kClampEvery);
  EXPECT_EQ(LazyPlusPolicy::Interval(s, 0), 1);
  EXPECT_EQ(LazyPlusPolicy::LastImportant(s, 1, last), 140000);
  EXPECT_EQ(LazyPlusPolicy::Interval(s, 1), 1000);
  EXPECT_EQ(LazyPlusPolicy::LastImportant(s, 2, last), 139000);
  EXPECT_EQ(LazyPlusPolicy::Interval(s, 2), 9000) << "its first interval, across a wrap";
  // The score reads the same clocks: the recurring slot outranks the long-silent one.
  EXPECT_GT(LazyPlusPolicy::Score(last, LazyPlusPolicy::LastImportant(s, 1, last), 1000),
            LazyPlusPolicy::Score(last, LazyPlusPolicy::LastImportant(s, 0, last), 1));
}

}  // namespace
}  // namespace recall::cache::eviction
