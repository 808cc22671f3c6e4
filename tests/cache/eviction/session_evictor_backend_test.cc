// LazyEviction stepped on the backend (SessionEvictorOptions::backend): the fused
// Backend::LazyObserve against the host's AppendSlots + ReduceGqaMax + Observe, and a whole
// evictor whose state lives in (opaque) backend memory against the host evictor, step by step.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/lazy_policy.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"
#include "tests/cache/eviction/append_rows.h"
#include "tests/cache/eviction/pseudo_attention.h"
#include "kernels/backend.h"

namespace recall::cache::eviction {
namespace {

constexpr int kLayers = 3, kKv = 2, kHeads = 6, kDim = 4, kStride = 160;

std::vector<float> Probs(const SequenceCache& seq, int t) {
  return testing::PseudoProbs(seq, t, kHeads, kStride, -1.0f);
}

// The K (is_v 0) or V (is_v 1) element d of the token at `position` in (layer, head).
float KvValue(int layer, int head, int position, int is_v, int d) {
  return static_cast<float>(position * 1000 + layer * 100 + head * 10 + is_v * 5 + d);
}

// Appends n tokens with their K/V rows.
void Append(SequenceCache& seq, int n) {
  testing::AppendRows(
      seq, n, [](int p, int l, int h, int d) { return KvValue(l, h, p, 0, d); },
      [](int p, int l, int h, int d) { return KvValue(l, h, p, 1, d); });
}

// Every slot's K/V rows are those of the token at its position.
void ExpectRowsFollowPositions(const SequenceCache& seq, int t) {
  const kernels::PagedKv kv = seq.View();
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kKv; ++h) {
      for (int s = 0; s < seq.length(l, h); ++s) {
        const int p = seq.position(l, h, s);
        for (int d = 0; d < kDim; ++d) {
          ASSERT_EQ(kv.K(l, h, s)[d], KvValue(l, h, p, 0, d)) << "t " << t << " slot " << s;
          ASSERT_EQ(kv.V(l, h, s)[d], KvValue(l, h, p, 1, d)) << "t " << t << " slot " << s;
        }
      }
    }
  }
}

TEST(LazyObserveTest, MatchesAppendReduceAndObserveOnTheHost) {
  std::unique_ptr<kernels::Backend> cpu = kernels::CreateCpuBackend();
  PolicyOptions po;
  po.alpha = 0.03f;
  const LazyPolicy policy(po);
  const int rows = kLayers * kKv, cap = 200;
  std::vector<HeadState> host(static_cast<size_t>(rows));
  std::vector<int32_t> ts(static_cast<size_t>(rows) * cap, -7), mri(ts.size(), -7);
  std::vector<int32_t> old_lens(static_cast<size_t>(rows), 0), lens(old_lens);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 0.1f);
  std::vector<float> probs(static_cast<size_t>(kLayers) * kHeads * kStride);
  std::vector<float> reduced(static_cast<size_t>(kKv) * kStride);
  int important = 0;
  for (int t = 1; t <= 12; ++t) {
    for (int r = 0; r < rows; ++r) {  // heads grow unevenly: 40 at first, then 0-3 a step
      lens[r] = old_lens[r] + (t == 1 ? 40 + r : (t * 7 + r * 3) % 4);
    }
    for (float& p : probs) p = u(rng);
    for (int l = 0; l < kLayers; ++l) {
      const int32_t* layer_lens = lens.data() + l * kKv;
      ReduceGqaMax(probs.data() + static_cast<size_t>(l) * kHeads * kStride, kHeads, kKv,
                   kStride, layer_lens, reduced.data());
      for (int h = 0; h < kKv; ++h) {
        HeadState& s = host[static_cast<size_t>(l * kKv + h)];
        AppendSlots(&s, layer_lens[h] - s.size(), t);
        policy.Observe(&s, reduced.data() + h * kStride, layer_lens[h], t);
      }
    }
    kernels::LazyObserveArgs a;
    a.probs = probs.data();
    a.probs_stride = kStride;
    a.n_layers = kLayers;
    a.n_heads = kHeads;
    a.n_kv_heads = kKv;
    a.ts = ts.data();
    a.mri = mri.data();
    a.state_stride = cap;
    a.old_lens = old_lens.data();
    a.lens = lens.data();
    a.alpha = po.alpha;
    a.t = t;
    cpu->LazyObserve(a);
    for (int r = 0; r < rows; ++r) {
      const HeadState& s = host[static_cast<size_t>(r)];
      ASSERT_EQ(s.size(), lens[r]);
      for (int j = 0; j < lens[r]; ++j) {
        ASSERT_EQ(ts[static_cast<size_t>(r) * cap + j], s.ts[static_cast<size_t>(j)])
            << "t " << t << " row " << r << " slot " << j;
        ASSERT_EQ(mri[static_cast<size_t>(r) * cap + j], s.mri[static_cast<size_t>(j)])
            << "t " << t << " row " << r << " slot " << j;
        important += s.ts[static_cast<size_t>(j)] == t;
      }
      // Slots past the length are not touched.
      EXPECT_EQ(ts[static_cast<size_t>(r) * cap + lens[r]], -7);
    }
    old_lens = lens;
  }
  EXPECT_GT(important, 100);  // the threshold splits the slots: both branches ran
}

// Backend::LazyEvict (the reference host loop) keeps what LazyPolicy::SelectKeep keeps, ties
// included, and moves each kept slot's K/V rows, ts and mri down with it.
TEST(LazyEvictTest, KeepsWhatLazyPolicySelectsAndMovesRowsAndStateWithTheSlots) {
  std::unique_ptr<kernels::Backend> cpu = kernels::CreateCpuBackend();
  auto pool = BlockPool::Create(kernels::PagedKvLayout{kLayers, kKv, kDim, 4}, 200);
  ASSERT_TRUE(pool.ok());
  SequenceCache seq(pool->get());
  constexpr int kLen = 120, kCap = 128, kWindow = 8, kT = 200;
  Append(seq, kLen);
  const int rows = kLayers * kKv;
  std::vector<int32_t> ts(static_cast<size_t>(rows) * kCap), mri(ts.size());
  std::mt19937 rng(11);
  for (size_t i = 0; i < ts.size(); ++i) {  // few distinct (ts, mri) pairs: many equal scores
    ts[i] = kT - static_cast<int32_t>(rng() % 6) * 3;
    mri[i] = static_cast<int32_t>(rng() % 4);
  }
  const std::vector<int32_t> ts0 = ts, mri0 = mri;
  const std::vector<int32_t> evict = {0, 2, 3, 5}, keeps = {kWindow, 30, 61, kLen - 1};
  const std::vector<int32_t> lens(evict.size(), kLen);
  std::vector<int32_t> keep_out(evict.size() * kCap, -1);
  kernels::LazyEvictArgs a;
  a.kv = seq.View();
  a.ts = ts.data();
  a.mri = mri.data();
  a.state_stride = kCap;
  a.n_rows = static_cast<int>(evict.size());
  a.rows = evict.data();
  a.lens = lens.data();
  a.keeps = keeps.data();
  a.window = kWindow;
  a.t = kT;
  a.keep_out = keep_out.data();
  a.keep_stride = kCap;
  cpu->LazyEvict(a);

  PolicyOptions po;
  po.window = kWindow;
  const LazyPolicy policy(po);
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  int tied_boundaries = 0;
  for (size_t i = 0; i < evict.size(); ++i) {
    const size_t r = static_cast<size_t>(evict[i]);
    HeadState state;
    state.ts.assign(ts0.begin() + r * kCap, ts0.begin() + r * kCap + kLen);
    state.mri.assign(mri0.begin() + r * kCap, mri0.begin() + r * kCap + kLen);
    state.score.assign(kLen, 0.0f);
    std::vector<int32_t> want;
    policy.SelectKeep(state, kLen, keeps[i], kT, ctx, &want);
    const std::vector<int32_t> got(keep_out.begin() + i * kCap,
                                   keep_out.begin() + i * kCap + keeps[i]);
    ASSERT_EQ(got, want) << "row " << r;
    // The choice had to break ties: a dropped slot scores as high as the last one kept.
    std::vector<bool> kept(kLen, false);
    for (int32_t j : got) kept[static_cast<size_t>(j)] = true;
    double lowest_kept = 1e9, highest_dropped = -1;
    for (int j = 0; j < kLen - kWindow; ++j) {
      const double sc = LazyPolicy::Score(kT, state.ts[static_cast<size_t>(j)],
                                          state.mri[static_cast<size_t>(j)]);
      if (kept[static_cast<size_t>(j)]) {
        lowest_kept = std::min(lowest_kept, sc);
      } else {
        highest_dropped = std::max(highest_dropped, sc);
      }
    }
    tied_boundaries += lowest_kept == highest_dropped;
    for (int k = 0; k < keeps[i]; ++k) {
      ASSERT_EQ(ts[r * kCap + k], ts0[r * kCap + got[static_cast<size_t>(k)]]) << k;
      ASSERT_EQ(mri[r * kCap + k], mri0[r * kCap + got[static_cast<size_t>(k)]]) << k;
    }
    seq.CompactMoved(evict[i] / kKv, evict[i] % kKv, got.data(), keeps[i]);
  }
  EXPECT_GE(tied_boundaries, 2);
  for (int r : {1, 4}) {  // rows not listed are left alone
    EXPECT_TRUE(std::equal(ts.begin() + r * kCap, ts.begin() + (r + 1) * kCap,
                           ts0.begin() + r * kCap));
    EXPECT_EQ(seq.length(r / kKv, r % kKv), kLen);
  }
  ExpectRowsFollowPositions(seq, kT);
}

// The same lazy run with the state on the host and on an opaque-memory CPU backend (the code
// a GPU runs, on the CPU).
class BackendEvictorTest : public ::testing::TestWithParam<int> {
 protected:
  const kernels::PagedKvLayout layout_{kLayers, kKv, kDim, 4};

  std::unique_ptr<SessionEvictor> Make(SequenceCache* seq, kernels::Backend* backend) {
    SessionEvictorOptions o;
    o.policy.name = "lazy";
    o.policy.window = 8;
    o.policy.alpha = 0.05f;
    o.budget.budget = GetParam();
    o.n_heads = kHeads;
    o.backend = backend;
    auto e = SessionEvictor::Create(o, seq);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  // Steps both evictors (t = 1..steps) alike and compares them step by step; with drop_every,
  // each such step then gives back the cache's newest `drop` tokens in both (DropNewest and
  // FollowDrop, a reply cut at a stop string).
  void RunBoth(int steps, int drop_every = 0, int drop = 0) {
    kernels::CpuBackendOptions bo;
    bo.opaque_memory = true;
    std::unique_ptr<kernels::Backend> opaque = kernels::CreateCpuBackend(bo);
    auto host_pool = BlockPool::Create(layout_, 400);
    auto dev_pool = BlockPool::Create(layout_, 400, opaque->memory());
    ASSERT_TRUE(host_pool.ok() && dev_pool.ok());
    SequenceCache host_seq(host_pool->get()), dev_seq(dev_pool->get());
    Append(host_seq, 70);
    Append(dev_seq, 70);
    std::unique_ptr<SessionEvictor> host = Make(&host_seq, nullptr);
    std::unique_ptr<SessionEvictor> dev = Make(&dev_seq, opaque.get());
    ASSERT_NE(host, nullptr);
    ASSERT_NE(dev, nullptr);
    EXPECT_FALSE(host->steps_on_backend());
    ASSERT_TRUE(dev->steps_on_backend());
    for (int t = 1; t <= steps; ++t) {
      if (t > 1) {
        Append(host_seq, 1);
        Append(dev_seq, 1);
      }
      const std::vector<float> p = Probs(host_seq, t);
      ASSERT_EQ(p, Probs(dev_seq, t));
      ASSERT_TRUE(host->Step(p.data(), kStride).ok());
      ASSERT_TRUE(dev->Step(p.data(), kStride).ok());
      ASSERT_EQ(dev->evictions(), host->evictions()) << "t " << t;
      ASSERT_EQ(dev->evicted_slots(), host->evicted_slots()) << "t " << t;
      if (drop_every > 0 && t % drop_every == 0) {
        host_seq.DropNewest(drop);
        dev_seq.DropNewest(drop);
        host->FollowDrop();
        dev->FollowDrop();
      }
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kKv; ++h) {
          ASSERT_EQ(dev_seq.length(l, h), host_seq.length(l, h)) << "t " << t;
          for (int s = 0; s < host_seq.length(l, h); ++s) {
            ASSERT_EQ(dev_seq.position(l, h, s), host_seq.position(l, h, s)) << "t " << t;
          }
        }
      }
      ExpectRowsFollowPositions(dev_seq, t);
      ExpectRowsFollowPositions(host_seq, t);
      if (t % 5 != 0) continue;
      ASSERT_TRUE(dev->SyncStates().ok());
      for (int l = 0; l < kLayers; ++l) {
        for (int h = 0; h < kKv; ++h) {
          EXPECT_EQ(dev->state(l, h).ts, host->state(l, h).ts) << "t " << t;
          EXPECT_EQ(dev->state(l, h).mri, host->state(l, h).mri) << "t " << t;
          EXPECT_EQ(host->state(l, h).ts.size(), static_cast<size_t>(host_seq.length(l, h)));
        }
      }
    }
    EXPECT_GT(host->evictions(), 0);
    EXPECT_EQ(dev_seq.bytes_held(), host_seq.bytes_held());
  }
};

TEST_P(BackendEvictorTest, KeepsWhatTheHostKeepsWithTheSameStates) { RunBoth(90); }

// Every 3rd step gives back the 2 newest tokens (cut replies): the state on the backend
// follows as the host's does, and both go on alike (the cache grows by a token in three).
TEST_P(BackendEvictorTest, GivesBackTheNewestSlotsAsTheHostDoes) { RunBoth(250, 3, 2); }

// 40: evicts from the first eviction step on; 140: the backend state grows from 128 to 256
// slots per head with contents in it (at 129 slots) before the first eviction (t = 72).
INSTANTIATE_TEST_SUITE_P(Budgets, BackendEvictorTest, ::testing::Values(40, 140));

TEST(BackendEvictorModeTest, OnlyLazyWithPerHeadSetsOnDeviceMemoryStepsOnTheBackend) {
  kernels::CpuBackendOptions bo;
  bo.opaque_memory = true;
  std::unique_ptr<kernels::Backend> opaque = kernels::CreateCpuBackend(bo);
  std::unique_ptr<kernels::Backend> host = kernels::CreateCpuBackend();
  const kernels::PagedKvLayout layout{kLayers, kKv, kDim, 4};
  auto pool = BlockPool::Create(layout, 64, opaque->memory());
  ASSERT_TRUE(pool.ok());
  SequenceCache seq(pool->get());
  const auto on_backend = [&](const std::string& policy, kernels::Backend* b,
                              bool shared) -> bool {
    SessionEvictorOptions o;
    o.policy.name = policy;
    o.budget.budget = 64;
    o.n_heads = kHeads;
    o.backend = b;
    o.share_tokens = shared;
    auto e = SessionEvictor::Create(o, &seq);
    EXPECT_TRUE(e.ok()) << policy << ": " << e.status();
    return e.ok() && (*e)->steps_on_backend();
  };
  EXPECT_TRUE(on_backend("lazy", opaque.get(), false));
  EXPECT_FALSE(on_backend("lazy", host.get(), false)) << "host memory: the host path";
  EXPECT_FALSE(on_backend("lazy", nullptr, false));
  EXPECT_FALSE(on_backend("lazy", opaque.get(), true)) << "shared token sets reduce on the host";
  EXPECT_FALSE(on_backend("h2o", opaque.get(), false));
}

}  // namespace
}  // namespace recall::cache::eviction
