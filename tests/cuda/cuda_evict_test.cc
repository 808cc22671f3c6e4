// LazyEviction's eviction step on the GPU (Backend::LazyEvict) against the CPU reference
// (CompareLazyEvict: keep lists, the compacted ts / mri state and every float of the pool must
// be equal), over head dims 8-256, rows from the window alone to past 8K slots, and states
// whose scores tie at the cut (few distinct (ts, mri) pairs) or spread over the whole range.
// Skips without a GPU.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "kernels/cpu/lazy_evict_check.h"
#include "tests/cuda/cuda_test_util.h"

namespace recall::kernels {
namespace {

struct EvictShape {
  int head_dim;
  bool ties;  // few distinct (ts, mri) pairs; otherwise ts in [0, t], mri in [0, t]
};

class CudaEvictTest : public CudaTest, public ::testing::WithParamInterface<EvictShape> {};

// Rows 0, 1, 3, 4, 5 of 3 layers x 2 KV heads are evicted (row 2 is left alone); W = 32.
TEST_P(CudaEvictTest, KeepsMovesAndCompactsExactlyAsTheReference) {
  ASSERT_FALSE(CudaEvictsOnHost(*gpu_)) << "the device's eviction failed its check at creation";
  const EvictShape p = GetParam();
  LazyEvictCase c;
  c.layout = PagedKvLayout{3, 2, p.head_dim, 16};
  c.window = 32;
  c.t = 9500;
  c.cap = 9024;
  c.rows = {0, 1, 3, 4, 5};
  c.lens = {9000, 4100, 513, 40, 2000};
  c.keeps = {2700, 1000, 512, 32, 33};
  const int per_layer = c.cap / c.layout.block_tokens;
  // Each layer gets a random third of the pool's blocks, in random order.
  std::vector<int32_t> ids(static_cast<size_t>(3 * per_layer));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(p.head_dim));
  for (int l = 0; l < 3; ++l) {
    c.tables.emplace_back(ids.begin() + l * per_layer, ids.begin() + (l + 1) * per_layer);
  }
  c.pool = RandomVec(ids.size() * c.layout.BlockFloats(), p.head_dim + 1);
  c.state.resize(2 * 6 * static_cast<size_t>(c.cap));
  const size_t plane = c.state.size() / 2;
  std::mt19937 rng(p.head_dim + 2);
  for (size_t i = 0; i < plane; ++i) {
    c.state[i] = p.ties ? c.t - static_cast<int32_t>(rng() % 30) * 5
                        : static_cast<int32_t>(rng() % (c.t + 1));
    c.state[plane + i] = static_cast<int32_t>(p.ties ? rng() % 7 : rng() % (c.t + 1));
  }
  const absl::Status st = CompareLazyEvict(*gpu_, c);
  EXPECT_TRUE(st.ok()) << st;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaEvictTest,
                         ::testing::Values(EvictShape{8, true}, EvictShape{64, true},
                                           EvictShape{64, false}, EvictShape{128, true},
                                           EvictShape{128, false}, EvictShape{256, false}),
                         [](const ::testing::TestParamInfo<EvictShape>& info) {
                           return "hd" + std::to_string(info.param.head_dim) +
                                  (info.param.ties ? "_ties" : "_spread");
                         });

// host_evict: the reference on rows copied back; the built-in check passes for it as for the
// device kernel.
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
