#include "cache/eviction/rkv_policy.h"

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

PolicyOptions RkvOptions(int interval, int query_window) {
  PolicyOptions o;
  o.name = "rkv";
  o.interval = interval;
  o.query_window = query_window;
  return o;
}

// keys [n, dim] with row j = sign * e_{axis}.
std::vector<float> AxisKeys(const std::vector<int>& axis, const std::vector<float>& sign, int dim) {
  std::vector<float> k(axis.size() * dim, 0.0f);
  for (size_t j = 0; j < axis.size(); ++j) k[j * dim + axis[j]] = sign[j];
  return k;
}

// Scenario: interval 16, q = 4. The attention sum restarts at step 13 (= 16 - 4 + 1) and
// accumulates over 13..16; steps 1..12 and 17..28 leave it alone. Compression only at
// multiples of 16 when over budget.
TEST(RkvPolicyTest, ObservesOnlyTheLastQueriesBeforeEachCompression) {
  RkvPolicy rkv(RkvOptions(16, 4));
  HeadState s;
  AppendSlots(&s, 2, 1);
  for (int t = 1; t <= 16; ++t) {
    const float p[2] = {static_cast<float>(t), 1.0f};
    rkv.Observe(&s, p, 2, t);
  }
  EXPECT_EQ(s.score, (std::vector<float>{13.0f + 14 + 15 + 16, 4.0f}));
  for (int t = 17; t <= 28; ++t) {
    const float p[2] = {100.0f, 100.0f};
    rkv.Observe(&s, p, 2, t);
  }
  EXPECT_EQ(s.score, (std::vector<float>{58.0f, 4.0f}));
  for (int t = 1; t <= 48; ++t) EXPECT_EQ(rkv.ShouldEvict(40, 20, t), t % 16 == 0) << t;
  EXPECT_FALSE(rkv.ShouldEvict(20, 20, 16));
  EXPECT_EQ(rkv.min_budget(), 4);
  EXPECT_EQ(RkvPolicy(RkvOptions(2, 8)).query_window(), 2) << "q is clipped to the interval";
}

// Scenario: 3 copies of e1 and one e2. Rows of S (zero diagonal): each copy sees the other
// two at 1 and spares the last similar one -> sum 1, mean 1/4; e2: no similar key, spares
// S[3][0] = 0 -> mean 0. D = softmax(1/4, 1/4, 1/4, 0).
TEST(RkvPolicyTest, RedundancyFollowsRkvCalSimilarity) {
  const std::vector<float> keys = AxisKeys({0, 0, 0, 1}, {2.0f, 1.0f, 3.0f, 1.0f}, 2);
  std::vector<float> normed;
  double d[4];
  RkvPolicy::Redundancy(keys.data(), 4, 2, &normed, d);
  const double z = 3 * std::exp(0.25) + 1;
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(d[j], std::exp(0.25) / z, 1e-7) << j;
  EXPECT_NEAR(d[3], 1.0 / z, 1e-7);
}

// Scenario (redundancy decides): uniform attention, 10 slots, q = 2, C = 5 -> keep the 3
// least redundant of candidates 0..7 plus slots 8, 9. Keys (dim 4): 0..3 = e1, 4 = e2,
// 5 = e3, 6 = e4, 7 = -e1, 8 = e2, 9 = e3. Row means x 10: e1 copies 3 - 1 - 1 (spared) = 1;
// slot 4, 5: 1 - 1 = 0; slot 6: 0; slot 7: -4 + 1 (spares S[7][0] = -1) = -3.
// Least redundant: 7, then 4, 5, 6 tie at 0 -> the older 4, 5. Keep {4, 5, 7, 8, 9}.
TEST(RkvPolicyTest, KeepsLeastRedundantWhenAttentionIsUniform) {
  RkvPolicy rkv(RkvOptions(4, 2));
  HeadState s;
  AppendSlots(&s, 10, 1);
  const std::vector<float> p(10, 0.1f);
  for (int t = 1; t <= 4; ++t) rkv.Observe(&s, p.data(), 10, t);
  const std::vector<float> keys =
      AxisKeys({0, 0, 0, 0, 1, 2, 3, 0, 1, 2}, {1, 1, 1, 1, 1, 1, 1, -1, 1, 1}, 4);
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  ctx.keys = keys.data();
  ctx.head_dim = 4;
  std::vector<int32_t> keep;
  rkv.SelectKeep(s, 10, 5, 4, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{4, 5, 7, 8, 9}));
}

// Scenario (importance decides): 20 mutually orthogonal keys (equal redundancy), q = 2,
// candidates 0..17. Mean attention 0.5 on slot 2, 0.3 on slot 15, 0.01 elsewhere; max-pooled
// with kernel 7: slots 0..5 -> 0.5, 12..17 -> 0.3, 6..11 -> 0.01. C = 5 keeps 3 candidates:
// 0, 1, 2 (ties, older first) -> {0, 1, 2, 18, 19}; C = 9 keeps 7: 0..5 and 12.
TEST(RkvPolicyTest, KeepsMaxPooledImportanceWhenRedundancyIsEqual) {
  RkvPolicy rkv(RkvOptions(4, 2));
  HeadState s;
  AppendSlots(&s, 20, 1);
  std::vector<float> p(20, 0.01f);
  p[2] = 0.5f;
  p[15] = 0.3f;
  rkv.Observe(&s, p.data(), 20, 3);  // window restart (to go = 1)
  rkv.Observe(&s, p.data(), 20, 4);
  std::vector<int> axis(20);
  std::iota(axis.begin(), axis.end(), 0);
  const std::vector<float> keys = AxisKeys(axis, std::vector<float>(20, 1.0f), 20);
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  ctx.keys = keys.data();
  ctx.head_dim = 20;
  std::vector<int32_t> keep;
  rkv.SelectKeep(s, 20, 5, 4, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 18, 19}));
  rkv.SelectKeep(s, 20, 9, 4, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 12, 18, 19}));
}

// Scenario: through SessionEvictor (1 layer, 1 KV head, 2 query heads), interval 4, q = 2,
// C = 6. Prompt of 8 tokens, then 4 decode steps with uniform attention; at t = 4 the cache
// holds 12 slots and compresses to 6 using the K rows in the cache. Keys by position:
// 0..3 e1, 4 e2, 5 e3, 6 e4, 7 -e1, 8 e2, 9 e3, 10 e4, 11 e4. Row sums over 12 keys: e1
// copies 1, positions 4, 5, 8, 9: 0, position 6: 2 - 1 = 1, position 7: -4 + 1 = -3.
// Candidates 0..9, keep 4: 7, then 4, 5, 8 (0, older first); plus the window 10, 11.
TEST(RkvSessionTest, CompressesEveryIntervalUsingCachedKeys) {
  const kernels::PagedKvLayout layout{1, 1, 4, 4};
  auto pool = BlockPool::Create(layout, 16);
  ASSERT_TRUE(pool.ok());
  SequenceCache seq(pool->get());
  SessionEvictorOptions o;
  o.policy = RkvOptions(4, 2);
  o.budget.budget = 6;
  o.n_heads = 2;
  auto ev = SessionEvictor::Create(o, &seq);
  ASSERT_TRUE(ev.ok()) << ev.status();
  const int axis[12] = {0, 0, 0, 0, 1, 2, 3, 0, 1, 2, 3, 3};
  auto append = [&](int n) {
    ASSERT_TRUE(seq.Reserve(n).ok());
    for (int i = 0; i < n; ++i) {
      const int pos = seq.next_position() + i;
      float* k = seq.View().K(0, 0, seq.length(0, 0) + i);
      for (int d = 0; d < 4; ++d) k[d] = d == axis[pos] ? (pos == 7 ? -1.0f : 1.0f) : 0.0f;
    }
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), seq.next_position());
    seq.CommitAppend(pos.data(), n);
  };
  append(8);
  const int64_t stride = 16;
  std::vector<float> probs(2 * stride);
  for (int t = 1; t <= 4; ++t) {
    append(1);
    const int len = seq.length(0, 0);
    for (int qh = 0; qh < 2; ++qh) {
      for (int j = 0; j < len; ++j) probs[qh * stride + j] = 1.0f / len;
    }
    ASSERT_TRUE((*ev)->Step(probs.data(), stride).ok());
    EXPECT_EQ(seq.length(0, 0), t < 4 ? 8 + t : 6) << t;
  }
  std::vector<int32_t> kept;
  for (int j = 0; j < seq.length(0, 0); ++j) kept.push_back(seq.position(0, 0, j));
  EXPECT_EQ(kept, (std::vector<int32_t>{4, 5, 7, 8, 10, 11}));
  EXPECT_EQ((*ev)->evictions(), 1);
}

}  // namespace
}  // namespace recall::cache::eviction
