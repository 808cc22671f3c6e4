// LazyEviction stepped on the backend (SessionEvictorOptions::backend): the fused
// Backend::LazyObserve against the host's AppendSlots + ReduceGqaMax + Observe, and a whole
// evictor whose state lives in (opaque) backend memory against the host evictor, step by step.
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
#include "tests/cache/eviction/pseudo_attention.h"
#include "kernels/backend.h"

namespace recall::cache::eviction {
namespace {

constexpr int kLayers = 3, kKv = 2, kHeads = 6, kDim = 4, kStride = 160;

std::vector<float> Probs(const SequenceCache& seq, int t) {
  return testing::PseudoProbs(seq, t, kHeads, kStride, -1.0f);
}

void Append(SequenceCache& seq, int n) {
  ASSERT_TRUE(seq.Reserve(n).ok());
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), seq.next_position());
  seq.CommitAppend(pos.data(), n);
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
};

TEST_P(BackendEvictorTest, KeepsWhatTheHostKeepsWithTheSameStates) {
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
  for (int t = 1; t <= 90; ++t) {
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
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKv; ++h) {
        ASSERT_EQ(dev_seq.length(l, h), host_seq.length(l, h)) << "t " << t;
        for (int s = 0; s < host_seq.length(l, h); ++s) {
          ASSERT_EQ(dev_seq.position(l, h, s), host_seq.position(l, h, s)) << "t " << t;
        }
      }
    }
    if (t % 5 != 0) continue;
    ASSERT_TRUE(dev->SyncStates().ok());
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKv; ++h) {
        EXPECT_EQ(dev->state(l, h).ts, host->state(l, h).ts) << "t " << t;
        EXPECT_EQ(dev->state(l, h).mri, host->state(l, h).mri) << "t " << t;
      }
    }
  }
  EXPECT_GT(host->evictions(), 0);
  EXPECT_EQ(dev_seq.bytes_held(), host_seq.bytes_held());
}

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
