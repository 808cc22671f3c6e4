// SessionEvictor::Step allocates nothing once warmed up (EVICTION.md: bookkeeping is
// O(cached tokens) per step with no allocation on the hot path). This binary replaces the
// global operator new with a counting one, so it is its own executable; the count is taken
// only around Step, after SessionEvictor::Reserve and a warm-up of steps past the budget.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <numeric>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace recall::cache::eviction {
namespace {

constexpr int kLayers = 3, kKv = 2, kHeads = 4, kDim = 8, kStride = 512;

struct Case {
  const char* policy;
  bool head_adaptive;
  float value_protection;
  bool on_backend = false;  // lazy stepped on an opaque-memory backend (the GPU's code path)
};

class HotPathAllocTest : public ::testing::TestWithParam<Case> {};

TEST_P(HotPathAllocTest, StepAllocatesNothingAfterWarmUp) {
  const Case& c = GetParam();
  kernels::CpuBackendOptions bo;
  bo.num_threads = 1;
  bo.opaque_memory = true;
  const std::unique_ptr<kernels::Backend> opaque = kernels::CreateCpuBackend(bo);
  auto pool = c.on_backend ? BlockPool::Create({kLayers, kKv, kDim, 16}, kLayers * 40,
                                               opaque->memory())
                           : BlockPool::Create({kLayers, kKv, kDim, 16}, kLayers * 40);
  ASSERT_TRUE(pool.ok());
  SequenceCache seq(pool->get());
  SessionEvictorOptions o;
  o.policy.name = c.policy;
  o.policy.window = 16;
  o.policy.alpha = 0.004f;
  o.policy.interval = 16;
  o.policy.value_protection = c.value_protection;
  o.budget.budget = 96;
  o.budget.head_adaptive = c.head_adaptive;
  o.n_heads = kHeads;
  if (c.on_backend) o.backend = opaque.get();
  auto ev = SessionEvictor::Create(o, &seq);
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_EQ((*ev)->steps_on_backend(), c.on_backend);
  (*ev)->Reserve(kStride);
  std::vector<float> probs(static_cast<size_t>(kLayers) * kHeads * kStride);
  uint32_t rng = 99;
  int64_t counted_steps = 0, allocations = 0, evictions_counted = 0;
  for (int step = 0; step < 400; ++step) {
    // Append one token (outside the measured region: that is the forward pass's work).
    ASSERT_TRUE(seq.Reserve(1).ok());
    const kernels::PagedKv kv = seq.View();
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKv; ++h) {
        for (int d = 0; d < kDim; ++d) {
          rng = rng * 1664525u + 1013904223u;
          kv.K(l, h, seq.length(l, h))[d] = static_cast<float>(rng >> 8) * 1e-7f;
          kv.V(l, h, seq.length(l, h))[d] = static_cast<float>(rng >> 12) * 1e-6f;
        }
      }
    }
    const int32_t pos = seq.next_position();
    seq.CommitAppend(&pos, 1);
    for (float& p : probs) {
      rng = rng * 1664525u + 1013904223u;
      p = static_cast<float>(rng >> 8) / static_cast<float>(1u << 24) * 0.01f;
    }
    const bool measure = step >= 200;  // well past the budget and several evictions
    const int64_t evictions_before = (*ev)->evictions();
    g_allocations = 0;
    g_counting = measure;
    const absl::Status st = (*ev)->Step(probs.data(), kStride);
    g_counting = false;
    ASSERT_TRUE(st.ok()) << st;
    if (measure) {
      ++counted_steps;
      allocations += g_allocations.load();
      evictions_counted += (*ev)->evictions() - evictions_before;
    }
  }
  EXPECT_GT(evictions_counted, 0) << "the measured steps must include evictions";
  EXPECT_EQ(allocations, 0) << c.policy << ": " << allocations << " allocations in "
                            << counted_steps << " steps";
}

INSTANTIATE_TEST_SUITE_P(
    Policies, HotPathAllocTest,
    ::testing::Values(Case{"lazy", false, 0.0f}, Case{"lazy", false, 0.0f, true},
                      Case{"lazy", false, 0.25f},
                      Case{"lazy", true, 0.0f}, Case{"h2o", false, 0.0f},
                      Case{"tova", false, 0.0f}, Case{"streaming", false, 0.0f},
                      Case{"vase", false, 0.0f}, Case{"rkv", false, 0.0f}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.policy) + (i.param.head_adaptive ? "_adaptive" : "") +
             (i.param.value_protection > 0 ? "_protected" : "") +
             (i.param.on_backend ? "_on_backend" : "");
    });

}  // namespace
}  // namespace recall::cache::eviction
