#include "cache/eviction/eviction_policy.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "cache/eviction/full_policy.h"
#include "cache/eviction/lazy_policy.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

TEST(CreatePolicyTest, EveryListedNameCreatesThePolicyOfThatName) {
  for (const std::string& name : PolicyNames()) {
    PolicyOptions options;
    options.name = name;
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = CreatePolicy(options);
    ASSERT_TRUE(policy.ok()) << name << ": " << policy.status();
    EXPECT_EQ((*policy)->name(), name);
  }
  EXPECT_EQ(PolicyNames(), (std::vector<std::string>{"full", "streaming", "h2o", "tova", "lazy",
                                                     "lazy+", "vase", "rkv", "snapkv"}));
}

TEST(CreatePolicyTest, UnknownNameIsInvalidArgumentListingValidNames) {
  PolicyOptions options;
  options.name = "snapkv2";
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = CreatePolicy(options);
  ASSERT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(policy.status().message(),
            "eviction policy: unknown name 'snapkv2'; valid names: full, streaming, h2o, tova, "
            "lazy, lazy+, vase, rkv, snapkv");
}

TEST(CreatePolicyTest, OutOfRangeOptionsNameTheField) {
  struct Case {
    PolicyOptions options;
    std::string field;
  };
  std::vector<Case> cases(8);
  cases[0].options.window = 0;
  cases[0].field = "window";
  cases[1].options.alpha = -1.0f;
  cases[1].field = "alpha";
  cases[2].options.sinks = -1;
  cases[2].field = "sinks";
  cases[3].options.value_protection = 1.0f;
  cases[3].field = "value_protection";
  cases[4].options.interval = 0;
  cases[4].field = "interval";
  cases[5].options.query_window = 0;
  cases[5].field = "query_window";
  cases[6].options.lambda = 1.5f;
  cases[6].field = "lambda";
  cases[7].options.merge_threshold = 1.5f;
  cases[7].field = "merge_threshold";
  for (Case& c : cases) {
    c.options.name = "lazy";
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = CreatePolicy(c.options);
    ASSERT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(policy.status().message().find(c.field), absl::string_view::npos)
        << policy.status();
  }
}

TEST(HeadStateTest, AppendSlotsStartsTsAtPreviousStepAndCompactMovesAllArraysTogether) {
  HeadState s;
  AppendSlots(&s, 3, 1);  // prompt seen at the first decode step: ts = 0
  AppendSlots(&s, 2, 5);  // appended before step 5: ts = 4
  EXPECT_EQ(s.ts, (std::vector<int32_t>{0, 0, 0, 4, 4}));
  EXPECT_EQ(s.mri, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  for (int i = 0; i < 5; ++i) {
    s.ts[i] = 10 + i;
    s.mri[i] = 20 + i;
    s.score[i] = 0.5f * i;
  }
  CompactState(&s, {1, 3, 4});
  EXPECT_EQ(s.ts, (std::vector<int32_t>{11, 13, 14}));
  EXPECT_EQ(s.mri, (std::vector<int32_t>{21, 23, 24}));
  EXPECT_EQ(s.score, (std::vector<float>{0.5f, 1.5f, 2.0f}));
  EXPECT_EQ(s.size(), 3);
}

// A state keeps only the arrays it names; the others stay empty (no memory), and size()
// follows the slots all the same.
TEST(HeadStateTest, KeepsOnlyTheArraysItNames) {
  HeadState none(kNoStateArrays);
  AppendSlots(&none, 7, 1);
  EXPECT_EQ(none.size(), 7);
  EXPECT_EQ(none.bytes(), 0);
  CompactState(&none, {0, 6});
  EXPECT_EQ(none.size(), 2);

  HeadState lazy(kTsArray | kMriArray);
  AppendSlots(&lazy, 5, 3);
  EXPECT_EQ(lazy.ts, (std::vector<int32_t>(5, 2)));
  EXPECT_EQ(lazy.mri, (std::vector<int32_t>(5, 0)));
  EXPECT_TRUE(lazy.score.empty());
  EXPECT_EQ(lazy.score.capacity(), 0u);
  EXPECT_EQ(lazy.bytes(), static_cast<int64_t>((lazy.ts.capacity() + lazy.mri.capacity()) * 4));

  HeadState scores(kScoreArray);
  AppendSlots(&scores, 4, 1);
  EXPECT_EQ(scores.size(), 4);
  EXPECT_TRUE(scores.ts.empty() && scores.mri.empty());
}

// What a state holds stays close to what it uses: one-slot appends grow it by a little, not
// by doubling, and compacting a long prompt to a budget gives the memory back.
TEST(HeadStateTest, BytesStayCloseToTheSlotsHeld) {
  HeadState s(kAllStateArrays);
  AppendSlots(&s, 4000, 1);  // a long prompt
  EXPECT_LE(s.bytes(), HeadStateBytesBound(kAllStateArrays, 4000));
  EXPECT_LE(HeadStateBytesBound(kAllStateArrays, 4000), 18 * 4200);
  std::vector<int32_t> keep(64);
  for (int i = 0; i < 64; ++i) keep[static_cast<size_t>(i)] = 3936 + i;
  CompactState(&s, keep);
  EXPECT_EQ(s.size(), 64);
  EXPECT_LE(s.bytes(), 18 * 80) << "the prompt's slots were given back";
  for (int t = 2; t < 200; ++t) {  // one slot a step, compacted back to 64 every 8 steps
    AppendSlots(&s, 1, t);
    EXPECT_LE(s.bytes(), HeadStateBytesBound(kAllStateArrays, 72)) << "t " << t;
    if (t % 8 == 0) {
      std::vector<int32_t> last(64);
      std::iota(last.begin(), last.end(), s.size() - 64);
      CompactState(&s, last);
    }
  }
}

TEST(HeadStateDeathTest, CompactWithNonAscendingKeepDies) {
  HeadState s;
  AppendSlots(&s, 4, 1);
  EXPECT_DEATH(CompactState(&s, {2, 1}), "ascend");
}

TEST(FullKvPolicyTest, NeverEvictsAndKeepsEverything) {
  FullKvPolicy full(PolicyOptions{});
  EXPECT_FALSE(full.ShouldEvict(1 << 20, 1, 64));
  HeadState s;
  AppendSlots(&s, 5, 1);
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  std::vector<int32_t> keep;
  full.SelectKeep(s, 5, 2, 1, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

// Scenario: 4 query heads, 2 KV heads (G = 2), stride 5, KV head lengths 4 and 3.
TEST(ReduceGqaMaxTest, TakesMaxOverEachGroupUpToItsLength) {
  const std::vector<float> probs = {
      0.1f, 0.5f, 0.2f, 0.2f, 9.0f,  // qh 0 -> kv 0
      0.4f, 0.1f, 0.3f, 0.2f, 9.0f,  // qh 1 -> kv 0
      0.7f, 0.2f, 0.1f, 9.0f, 9.0f,  // qh 2 -> kv 1
      0.3f, 0.6f, 0.1f, 9.0f, 9.0f,  // qh 3 -> kv 1
  };
  const int32_t lengths[2] = {4, 3};
  std::vector<float> out(10, -1.0f);
  ReduceGqaMax(probs.data(), 4, 2, 5, lengths, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.4f, 0.5f, 0.3f, 0.2f, -1.0f,  //
                                     0.7f, 0.6f, 0.1f, -1.0f, -1.0f}));
}

TEST(ReduceGqaMaxTest, IsTheIdentityWithoutGrouping) {
  const std::vector<float> probs = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
  const int32_t lengths[2] = {3, 3};
  std::vector<float> out(6);
  ReduceGqaMax(probs.data(), 2, 2, 3, lengths, out.data());
  EXPECT_EQ(out, probs);
}

TEST(AverageOverHeadsTest, MeansEverySlotOverTheLayersQueryHeads) {
  const std::vector<float> probs = {0.2f, 0.4f, 0.0f, 9.0f,  //
                                    0.6f, 0.0f, 1.0f, 9.0f};
  std::vector<float> out(3);
  AverageOverHeads(probs.data(), 2, 4, 3, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.4f);
  EXPECT_FLOAT_EQ(out[1], 0.2f);
  EXPECT_FLOAT_EQ(out[2], 0.5f);
}

TEST(ValueRangeTest, IsMaxMinusMinOverHeadDim) {
  const float v[4] = {0.5f, -2.0f, 3.0f, 1.0f};
  EXPECT_FLOAT_EQ(ValueRange(v, 4), 5.0f);
}

// Scenario: LazyEviction's released code keeps one state per QUERY head; we keep one per KV
// head fed with the group max. Over 12 steps of pseudo-random probabilities for 4 query
// heads in 2 groups, the KV-head state must equal what the per-query-head states imply:
// ts_kv = max over the group's ts (a slot is important for the KV head iff for any query
// head), and mri_kv <= max over the group's mri (union importance only shortens gaps). With
// one query head per group (per-query-head mode) both states are identical, and so is the
// keep set.
TEST(GqaReductionTest, KvHeadStateMatchesPerQueryHeadStatesOfItsGroup) {
  constexpr int kHeads = 4, kKv = 2, kLen = 10, kSteps = 12;
  PolicyOptions options;
  options.name = "lazy";
  options.alpha = 0.12f;
  options.window = 4;
  LazyPolicy lazy(options);
  std::vector<HeadState> per_q(kHeads), per_kv(kKv);
  for (HeadState& s : per_q) AppendSlots(&s, kLen, 1);
  for (HeadState& s : per_kv) AppendSlots(&s, kLen, 1);
  uint32_t rng = 12345;
  auto next = [&rng] {
    rng = rng * 1664525u + 1013904223u;
    return static_cast<float>(rng >> 8) / static_cast<float>(1u << 24) * 0.25f;
  };
  std::vector<float> probs(kHeads * kLen), reduced(kKv * kLen);
  const int32_t lengths[kKv] = {kLen, kLen};
  for (int t = 1; t <= kSteps; ++t) {
    for (float& p : probs) p = next();
    for (int qh = 0; qh < kHeads; ++qh) lazy.Observe(&per_q[qh], &probs[qh * kLen], kLen, t);
    ReduceGqaMax(probs.data(), kHeads, kKv, kLen, lengths, reduced.data());
    for (int kh = 0; kh < kKv; ++kh) lazy.Observe(&per_kv[kh], &reduced[kh * kLen], kLen, t);
    for (int kh = 0; kh < kKv; ++kh) {
      for (int j = 0; j < kLen; ++j) {
        const HeadState& a = per_q[2 * kh];
        const HeadState& b = per_q[2 * kh + 1];
        EXPECT_EQ(per_kv[kh].ts[j], std::max(a.ts[j], b.ts[j])) << "t=" << t << " j=" << j;
        EXPECT_LE(per_kv[kh].mri[j], std::max(a.mri[j], b.mri[j])) << "t=" << t << " j=" << j;
      }
    }
  }
  // Per-query-head mode: n_kv_heads = n_heads, the reduction is the identity.
  std::vector<HeadState> ident(kHeads);
  for (HeadState& s : ident) AppendSlots(&s, kLen, 1);
  rng = 12345;
  const int32_t lengths4[kHeads] = {kLen, kLen, kLen, kLen};
  std::vector<float> reduced4(kHeads * kLen);
  for (int t = 1; t <= kSteps; ++t) {
    for (float& p : probs) p = next();
    ReduceGqaMax(probs.data(), kHeads, kHeads, kLen, lengths4, reduced4.data());
    for (int qh = 0; qh < kHeads; ++qh) lazy.Observe(&ident[qh], &reduced4[qh * kLen], kLen, t);
  }
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  for (int qh = 0; qh < kHeads; ++qh) {
    EXPECT_EQ(ident[qh].ts, per_q[qh].ts);
    EXPECT_EQ(ident[qh].mri, per_q[qh].mri);
    std::vector<int32_t> keep_a, keep_b;
    lazy.SelectKeep(ident[qh], kLen, 6, kSteps, ctx, &keep_a);
    lazy.SelectKeep(per_q[qh], kLen, 6, kSteps, ctx, &keep_b);
    EXPECT_EQ(keep_a, keep_b);
  }
}

}  // namespace
}  // namespace recall::cache::eviction
