// The scenario LazyEviction exists for: token-importance recurrence.
//
// Synthetic attention trace over one layer, one KV head, one query head (so the GQA and
// TOVA reductions are the identity), unnormalised weights (the policies only compare and
// accumulate them):
//  - 3 "recurring" prompt tokens (positions 16, 19, 22) get 0.2 at their recurrence steps
//    (t = 1 and then every 38 / 40 / 42 steps) and 1e-6 in between (quiet);
//  - recency: the 8 newest tokens get 0.04 each (below lazy's alpha = 0.05: attended, but
//    not "important"; H2O accumulates it, 8 steps x 0.04 = 0.32 per token);
//  - every other token gets deterministic noise in [1e-5, 1e-4).
// Prompt 24 tokens, budget C = 24, window W = 8 (lazy's lag window, H2O's recent window),
// 200 decode steps.
//  - H2O: after one recurrence a recurring token has 0.2 accumulated, less than the 0.32 of
//    every decode token that has passed through the recent window; it is evicted before it
//    recurs (eviction is permanent).
//  - TOVA: a recurring token has the lowest last-query attention (1e-6) on any quiet step
//    and is dropped within a few steps.
//  - LazyEviction: after its first recurrence a recurring token has mri > 0 and S > 0
//    (S >= 2 / (1 + e^2) = 0.238 while t - ts <= mri), while every other token was never
//    important (S = 0): the three are kept to the end. They are not saved by the older-first
//    tie rule: the 13 older zero-score prompt slots 0..12 fill the rest of the C - W = 16,
//    and with the recurrences removed from the trace all three are lost (checked by hand).
#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

constexpr int kPrompt = 24, kBudget = 24, kWindow = 8, kSteps = 200, kStride = 256;
constexpr int kRecurring[3] = {16, 19, 22};
constexpr int kPeriod[3] = {38, 40, 42};

float Attention(int position, int newest_position, int t) {
  for (int i = 0; i < 3; ++i) {
    if (position == kRecurring[i]) return (t - 1) % kPeriod[i] == 0 ? 0.2f : 1e-6f;
  }
  if (newest_position - position < 8) return 0.04f;
  uint32_t x = static_cast<uint32_t>(position) * 2654435761u ^ static_cast<uint32_t>(t) * 40503u;
  x ^= x >> 15;
  x *= 0x2c1b3c6du;
  x ^= x >> 12;
  return 1e-5f + static_cast<float>(x % 1000) * 9e-8f;
}

struct Outcome {
  std::vector<int32_t> positions;  // kept at the end
  int peak_len = 0;
};

Outcome RunTrace(const std::string& policy) {
  kernels::PagedKvLayout layout{1, 1, 4, 16};
  auto pool = BlockPool::Create(layout, 64);
  EXPECT_TRUE(pool.ok());
  SequenceCache seq(pool->get());
  SessionEvictorOptions o;
  o.policy.name = policy;
  o.policy.window = kWindow;
  o.policy.alpha = 0.05f;
  o.budget.budget = kBudget;
  o.n_heads = 1;
  absl::StatusOr<std::unique_ptr<SessionEvictor>> ev = SessionEvictor::Create(o, &seq);
  EXPECT_TRUE(ev.ok()) << ev.status();
  Outcome out;
  auto append = [&seq](int n) {
    EXPECT_TRUE(seq.Reserve(n).ok());
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), seq.next_position());
    seq.CommitAppend(pos.data(), n);
  };
  append(kPrompt);
  std::vector<float> probs(kStride);
  for (int t = 1; t <= kSteps; ++t) {
    append(1);
    out.peak_len = std::max(out.peak_len, seq.length(0, 0));
    const int newest = seq.next_position() - 1;
    for (int s = 0; s < seq.length(0, 0); ++s) {
      probs[static_cast<size_t>(s)] = Attention(seq.position(0, 0, s), newest, t);
    }
    EXPECT_TRUE((*ev)->Step(probs.data(), kStride).ok());
  }
  for (int s = 0; s < seq.length(0, 0); ++s) out.positions.push_back(seq.position(0, 0, s));
  return out;
}

bool Holds(const Outcome& o, int position) {
  return std::find(o.positions.begin(), o.positions.end(), position) != o.positions.end();
}

TEST(RecurrenceTest, LazyKeepsRecurringTokensThatH2oAndTovaEvict) {
  const Outcome lazy = RunTrace("lazy");
  const Outcome h2o = RunTrace("h2o");
  const Outcome tova = RunTrace("tova");
  const Outcome full = RunTrace("full");
  for (int r : kRecurring) {
    EXPECT_TRUE(Holds(lazy, r)) << "lazy lost recurring token " << r;
    EXPECT_FALSE(Holds(h2o, r)) << "h2o kept recurring token " << r;
    EXPECT_FALSE(Holds(tova, r)) << "tova kept recurring token " << r;
    EXPECT_TRUE(Holds(full, r));
  }
  // Budgets were respected: lazy ends exactly at C (200 % 8 == 0) after peaking at C + W,
  // the others hold C.
  EXPECT_EQ(lazy.positions.size(), static_cast<size_t>(kBudget));
  EXPECT_EQ(lazy.peak_len, kBudget + kWindow);
  EXPECT_EQ(h2o.positions.size(), static_cast<size_t>(kBudget));
  EXPECT_EQ(tova.positions.size(), static_cast<size_t>(kBudget));
  EXPECT_EQ(full.positions.size(), static_cast<size_t>(kPrompt + kSteps));
  // Lazy's exact final cache: the 13 oldest zero-score prompt slots, the 3 recurring tokens,
  // the last W.
  std::vector<int32_t> expected;
  for (int p = 0; p <= 12; ++p) expected.push_back(p);
  for (int r : kRecurring) expected.push_back(r);
  for (int p = kPrompt + kSteps - kWindow; p < kPrompt + kSteps; ++p) expected.push_back(p);
  EXPECT_EQ(lazy.positions, expected);
}

}  // namespace
}  // namespace recall::cache::eviction
