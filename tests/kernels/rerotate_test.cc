// Backend::RerotateKeys: keys stored by Rope at their old positions, moved to new positions,
// equal the keys Rope computes at the new positions directly (1e-5 relative), in both RoPE
// layouts, for moves down from far past the context (20,000+) and up; V rows and the slots
// past each row's length are not touched.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/rerotate_check.h"
#include "tests/kernels/delegating_backend.h"

namespace recall::kernels {
namespace {

struct RerotateCase {
  int head_dim;
  RopeStyle style;
};

class RerotateTest : public ::testing::TestWithParam<RerotateCase> {};

TEST_P(RerotateTest, MovedKeysEqualKeysComputedAtTheNewPositions) {
  const int hd = GetParam().head_dim;
  const RopeStyle style = GetParam().style;
  const float theta = 10000.0f;
  constexpr int kLayers = 2, kKvHeads = 2, kBlock = 4, kStride = 40;
  const PagedKvLayout layout{kLayers, kKvHeads, hd, kBlock};
  const int lens[kLayers * kKvHeads] = {37, 9, 0, 21};
  const int blocks_per_layer = kStride / kBlock;
  std::vector<float> pool(static_cast<size_t>(kLayers * blocks_per_layer) * layout.BlockFloats(),
                          -777.0f);
  std::vector<std::vector<int32_t>> tables(kLayers);
  const int32_t* table_ptrs[kLayers];
  int32_t counts[kLayers];
  for (int l = 0; l < kLayers; ++l) {
    for (int b = 0; b < blocks_per_layer; ++b) tables[l].push_back(l * blocks_per_layer + b);
    table_ptrs[l] = tables[l].data();
    counts[l] = blocks_per_layer;
  }
  const PagedKv kv{layout, pool.data(), table_ptrs, counts};
  std::unique_ptr<Backend> cpu = CreateCpuBackend({1});
  std::mt19937 rng(hd * 7 + static_cast<int>(style));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<int32_t> from(kLayers * kKvHeads * kStride), to(from.size());
  std::vector<float> raw(from.size() * hd);
  for (float& x : raw) x = uni(rng);
  for (int r = 0; r < kLayers * kKvHeads; ++r) {
    // Old positions: increasing, up to past 20,000 (a session far past its context); new:
    // consecutive, ending at 512, or (row 3) moved up.
    int32_t p = r == 3 ? 5 : 20000;
    for (int s = 0; s < lens[r]; ++s) {
      p += 1 + static_cast<int32_t>(rng() % 97);
      from[r * kStride + s] = p;
      to[r * kStride + s] = r == 3 ? p + 300 : 512 - lens[r] + s;
    }
  }
  // Store Rope(raw, from) as the cached keys, and a known value in every V row.
  for (int r = 0; r < kLayers * kKvHeads; ++r) {
    const PagedKvHead head = kv.Head(r / kKvHeads, r % kKvHeads);
    for (int s = 0; s < lens[r]; ++s) {
      float* k = head.K(s);
      std::copy_n(&raw[(r * kStride + s) * hd], hd, k);
      cpu->Rope(k, &from[r * kStride + s], 1, 1, hd, theta, style);
      std::fill_n(head.V(s), hd, 0.5f + r);
    }
  }
  const std::vector<float> before = pool;
  RerotateArgs a;
  a.kv = kv;
  a.lens = lens;
  a.from = from.data();
  a.to = to.data();
  a.stride = kStride;
  a.theta = theta;
  a.style = style;
  cpu->RerotateKeys(a);
  for (int r = 0; r < kLayers * kKvHeads; ++r) {
    const PagedKvHead head = kv.Head(r / kKvHeads, r % kKvHeads);
    for (int s = 0; s < lens[r]; ++s) {
      std::vector<float> direct(&raw[(r * kStride + s) * hd], &raw[(r * kStride + s) * hd] + hd);
      cpu->Rope(direct.data(), &to[r * kStride + s], 1, 1, hd, theta, style);
      double err = 0, norm = 0;
      for (int i = 0; i < hd; ++i) {
        err += std::pow(double(head.K(s)[i]) - direct[i], 2);
        norm += std::pow(double(direct[i]), 2);
      }
      EXPECT_LE(std::sqrt(err / norm), 1e-5)
          << "row " << r << " slot " << s << " from " << from[r * kStride + s] << " to "
          << to[r * kStride + s];
      for (int i = 0; i < hd; ++i) ASSERT_EQ(head.V(s)[i], 0.5f + r);
    }
    for (int s = lens[r]; s < kStride; ++s) {  // past the row's length: untouched
      const int64_t at = head.K(s) - pool.data();
      ASSERT_TRUE(std::equal(pool.begin() + at, pool.begin() + at + hd, before.begin() + at));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RerotateTest,
                         ::testing::Values(RerotateCase{8, RopeStyle::kInterleaved},
                                           RerotateCase{64, RopeStyle::kInterleaved},
                                           RerotateCase{64, RopeStyle::kHalfSplit},
                                           RerotateCase{128, RopeStyle::kHalfSplit}));

}  // namespace
}  // namespace recall::kernels

namespace recall::kernels {
namespace {

// The start-up check a GPU backend runs, on the CPU backends (host and opaque memory): the
// comparison machinery itself, and the default op on memory the host reaches only by copies.
TEST(RerotateCheckTest, TheCpuBackendsPassTheStartUpCheck) {
  EXPECT_TRUE(CheckRerotate(*CreateCpuBackend({2})).ok()) << CheckRerotate(*CreateCpuBackend({2}));
  EXPECT_TRUE(CheckRerotate(*CreateCpuBackend({2, /*opaque_memory=*/true})).ok());
}

// A backend that moves keys one position short fails the check, naming the key.
TEST(RerotateCheckTest, AWrongRotationIsCaught) {
  class OneShort final : public testing::DelegatingBackend {
   public:
    void RerotateKeys(const RerotateArgs& a) override {
      std::vector<int32_t> to(a.to,
                              a.to + a.kv.layout.n_layers * a.kv.layout.n_kv_heads * a.stride);
      for (int32_t& p : to) --p;
      RerotateArgs b = a;
      b.to = to.data();
      Backend::RerotateKeys(b);
    }
  };
  OneShort backend;
  const absl::Status st = CheckRerotate(backend);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("moved the key of row 0 slot 0"), std::string::npos) << st;
}

}  // namespace
}  // namespace recall::kernels
