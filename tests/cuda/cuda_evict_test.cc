// LazyEviction's eviction step on the GPU (Backend::LazyEvict) against the CPU reference:
// keep lists, the compacted ts / mri state and every float of the pool must be equal, over
// head dims 8-256, rows from the window alone to past 8K slots, and states whose scores tie
// at the cut (few distinct (ts, mri) pairs) or spread over the whole range. Skips without a
// GPU.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "kernels/cpu/lazy_evict_check.h"
#include "tests/cuda/cuda_test_util.h"

namespace recall::kernels {
namespace {

struct EvictCase {
  int head_dim;
  bool ties;  // few distinct (ts, mri) pairs; otherwise ts in [0, t], mri in [0, t]
};

class CudaEvictTest : public CudaTest, public ::testing::WithParamInterface<EvictCase> {};

// Rows 0, 1, 3, 4, 5 of 3 layers x 2 KV heads are evicted (row 2 is left alone); W = 32.
TEST_P(CudaEvictTest, KeepsMovesAndCompactsExactlyAsTheReference) {
  ASSERT_FALSE(CudaEvictsOnHost(*gpu_)) << "the device's eviction failed its check at creation";
  const EvictCase c = GetParam();
  const PagedKvLayout layout{3, 2, c.head_dim, 16};
  const int window = 32, t = 9500, cap = 9024, rows = 6;
  const std::vector<int32_t> evict = {0, 1, 3, 4, 5};
  const std::vector<int32_t> lens = {9000, 4100, 513, 40, 2000};
  const std::vector<int32_t> keeps = {2700, 1000, 512, 32, 33};
  const int per_layer = cap / layout.block_tokens;
  const int n_blocks = layout.n_layers * per_layer;
  // Each layer gets a random third of the pool's blocks, in random order.
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(c.head_dim));
  std::vector<const int32_t*> tables;
  for (int l = 0; l < layout.n_layers; ++l) tables.push_back(ids.data() + l * per_layer);
  const std::vector<int32_t> counts(layout.n_layers, per_layer);
  const std::vector<float> pool =
      RandomVec(static_cast<size_t>(n_blocks) * layout.BlockFloats(), c.head_dim + 1);
  std::vector<int32_t> state(2 * static_cast<size_t>(rows) * cap);
  std::mt19937 rng(c.head_dim + 2);
  for (size_t i = 0; i < state.size() / 2; ++i) {
    state[i] = c.ties ? t - static_cast<int32_t>(rng() % 30) * 5 : static_cast<int32_t>(rng() % (t + 1));
    state[state.size() / 2 + i] = static_cast<int32_t>(c.ties ? rng() % 7 : rng() % (t + 1));
  }
  const std::vector<int32_t> keep_init(evict.size() * cap, -1);

  LazyEvictArgs a;
  a.kv.layout = layout;
  a.kv.block_tables = tables.data();
  a.kv.block_counts = counts.data();
  a.state_stride = cap;
  a.n_rows = static_cast<int>(evict.size());
  a.rows = evict.data();
  a.lens = lens.data();
  a.keeps = keeps.data();
  a.window = window;
  a.t = t;
  a.keep_stride = cap;

  std::vector<float> want_pool = pool;
  std::vector<int32_t> want_state = state, want_keep = keep_init;
  LazyEvictArgs h = a;
  h.kv.pool = want_pool.data();
  h.ts = want_state.data();
  h.mri = want_state.data() + state.size() / 2;
  h.keep_out = want_keep.data();
  cpu_->LazyEvict(h);

  DeviceVec<float> d_pool(*gpu_, pool);
  DeviceVec<int32_t> d_state(*gpu_, state), d_keep(*gpu_, keep_init);
  LazyEvictArgs d = a;
  d.kv.pool = d_pool.get();
  d.ts = d_state.get();
  d.mri = d_state.get() + state.size() / 2;
  d.keep_out = d_keep.get();
  gpu_->LazyEvict(d);
  ASSERT_TRUE(gpu_->Health().ok()) << gpu_->Health();
  const std::vector<int32_t> got_keep = d_keep.Download();
  for (size_t i = 0; i < evict.size(); ++i) {
    const auto begin = static_cast<std::ptrdiff_t>(i * cap);
    ASSERT_TRUE(std::equal(got_keep.begin() + begin, got_keep.begin() + begin + keeps[i],
                           want_keep.begin() + begin))
        << "keep list of row " << evict[i];
  }
  ASSERT_EQ(d_state.Download(), want_state);
  ASSERT_EQ(d_pool.Download(), want_pool);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaEvictTest,
                         ::testing::Values(EvictCase{8, true}, EvictCase{64, true},
                                           EvictCase{64, false}, EvictCase{128, true},
                                           EvictCase{128, false}, EvictCase{256, false}),
                         [](const ::testing::TestParamInfo<EvictCase>& info) {
                           return "hd" + std::to_string(info.param.head_dim) +
                                  (info.param.ties ? "_ties" : "_spread");
                         });

// host_evict: the reference on rows copied back; the same check passes.
TEST_F(CudaTest, HostEvictPassesTheCheck) {
  CudaBackendOptions o;
  o.host_evict = true;
  auto host = CreateCudaBackend(o);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(CudaEvictsOnHost(**host));
  EXPECT_TRUE(CheckLazyEvict(**host).ok()) << CheckLazyEvict(**host);
  EXPECT_TRUE(CheckLazyEvict(*gpu_).ok()) << CheckLazyEvict(*gpu_);
}

}  // namespace
}  // namespace recall::kernels
