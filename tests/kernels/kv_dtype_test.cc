// KV rows in every stored type (kernels/kv_rows.h): store then load against fp32, and the
// CPU backend's StoreKv / PrefillAttention / DecodeAttention / RerotateKeys / CompactRows on a
// pool of each type against the fp32 reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/rerotate.h"
#include "kernels/kv_rows.h"
#include "kernels/memory.h"
#include "tests/kernels/reference.h"

namespace recall::kernels {
namespace {

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float FromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

std::vector<float> Values(int n, uint32_t seed, float range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-range, range);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = uni(rng);
  return x;
}

std::vector<float> RoundTrip(KvDType t, const std::vector<float>& x, float* scale_out = nullptr) {
  std::vector<uint8_t> data(x.size() * KvElemBytes(t));
  float scale = -1.0f;
  EncodeKvRow(t, x.data(), static_cast<int>(x.size()), data.data(), &scale);
  std::vector<float> y(x.size());
  DecodeKvRow(t, data.data(), scale, static_cast<int>(x.size()), y.data());
  if (scale_out != nullptr) *scale_out = scale;
  return y;
}

TEST(KvRowsTest, F32IsExact) {
  const std::vector<float> x = Values(256, 1, 100.0f);
  EXPECT_EQ(RoundTrip(KvDType::kF32, x), x);
}

// bf16 keeps the top 16 bits of the fp32 pattern, rounded to nearest, ties to even: the
// loaded value is one of the two bf16 neighbours of x, the nearer one, and on a tie the one
// with an even last bit.
TEST(KvRowsTest, Bf16RoundsToNearestEven) {
  std::vector<float> x = Values(4096, 2, 1000.0f);
  // Exact ties: 1 + 2^-8 (lower neighbour even), 1 + 3 * 2^-8 (upper neighbour even).
  x.push_back(1.0f + 1.0f / 256);
  x.push_back(1.0f + 3.0f / 256);
  x.push_back(-(1.0f + 3.0f / 256));
  const std::vector<float> y = RoundTrip(KvDType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const float lo = FromBits(Bits(x[i]) & 0xFFFF0000u);
    const float hi = FromBits((Bits(x[i]) & 0xFFFF0000u) + 0x10000u);
    ASSERT_TRUE(y[i] == lo || y[i] == hi) << x[i] << " -> " << y[i];
    const double dy = std::fabs(double{x[i]} - y[i]);
    const double other = std::fabs(double{x[i]} - (y[i] == lo ? hi : lo));
    ASSERT_LE(dy, other) << x[i];
    if (dy == other) {
      EXPECT_EQ(Bits(y[i]) & 0x10000u, 0u) << "tie not to even: " << x[i];
    }
  }
  EXPECT_EQ(y[x.size() - 3], 1.0f);
  EXPECT_EQ(y[x.size() - 2], 1.0f + 4.0f / 256);
  EXPECT_EQ(y[x.size() - 1], -(1.0f + 4.0f / 256));
}

// f16 against the compiler's own conversion (_Float16: round to nearest even), inputs within
// f16's range; beyond it the store saturates at +-65504 instead of overflowing to infinity.
TEST(KvRowsTest, F16RoundsToNearestEvenAndSaturates) {
  std::vector<float> x = Values(4096, 3, 60000.0f);
  const std::vector<float> small = Values(1024, 4, 1e-3f);  // subnormals of f16 included
  x.insert(x.end(), small.begin(), small.end());
  x.push_back(1.0f + 1.0f / 2048);  // a tie
  const std::vector<float> y = RoundTrip(KvDType::kF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(y[i], static_cast<float>(static_cast<_Float16>(x[i]))) << x[i];
  }
  EXPECT_EQ(y.back(), 1.0f);
  const std::vector<float> big = RoundTrip(KvDType::kF16, {1e6f, -1e6f, 70000.0f});
  EXPECT_EQ(big, (std::vector<float>{65504.0f, -65504.0f, 65504.0f}));
}

// int8: scale = max|x| / 127, so every element is within half a step, max|x| / 254, and the
// largest one is exact up to the scale's rounding. A zero row loads as zeros.
TEST(KvRowsTest, Int8StaysWithinHalfAStep) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const float range = std::pow(10.0f, static_cast<float>(seed % 7) - 3);
    const std::vector<float> x = Values(128, 10 + seed, range);
    float scale = 0;
    const std::vector<float> y = RoundTrip(KvDType::kInt8, x, &scale);
    float max_abs = 0;
    for (float v : x) max_abs = std::max(max_abs, std::fabs(v));
    EXPECT_FLOAT_EQ(scale, max_abs / 127);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(x[i] - y[i]), max_abs / 254 * (1 + 1e-5f)) << "seed " << seed;
    }
  }
  float scale = -1;
  EXPECT_EQ(RoundTrip(KvDType::kInt8, std::vector<float>(64, 0.0f), &scale),
            std::vector<float>(64, 0.0f));
  EXPECT_EQ(scale, 0.0f);
}

// The attention error each type may add over fp32 K and V in [-1, 1] (output and
// probabilities), set from the types' rounding: bf16 2^-9, f16 2^-12, int8 1/254 relative.
double Tolerance(KvDType t) {
  switch (t) {
    case KvDType::kF32:
      return 1e-5;
    case KvDType::kBF16:
      return 4e-3;
    case KvDType::kF16:
      return 5e-4;
    case KvDType::kInt8:
      return 8e-3;
  }
  return 0;
}

// A layer of a paged pool of one type: two KV heads of different lengths, blocks shuffled.
class TypedAttentionTest : public ::testing::TestWithParam<KvDType> {
 protected:
  static constexpr int kLayers = 2, kKvHeads = 2, kBlockTokens = 4, kPoolBlocks = 40, kLayer = 1;
  static constexpr int kHeadDim = 64, kHeads = 4;

  void SetUp() override {
    layout_ = PagedKvLayout{kLayers, kKvHeads, kHeadDim, kBlockTokens, GetParam()};
    pool_.assign(static_cast<size_t>(kPoolBlocks * layout_.BlockBytes()), 0xA5);
    std::vector<int32_t> ids(kPoolBlocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    table_.assign(ids.begin(), ids.begin() + 16);
    tables_[0] = tables_[1] = table_.data();
    counts_[0] = counts_[1] = 16;
    kv_ = PagedKv{layout_, pool_.data(), tables_, counts_};
  }

  // Stores `n` tokens of random K and V after `start` per head; returns them, [n][h][d].
  void Store(int n, const int32_t* start, std::vector<float>* k, std::vector<float>* v,
             uint32_t seed) {
    *k = Values(n * kKvHeads * kHeadDim, seed, 1.0f);
    *v = Values(n * kKvHeads * kHeadDim, seed + 1, 1.0f);
    backend_->StoreKv(kv_, kLayer, k->data(), v->data(), n, start);
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend({2});
  PagedKvLayout layout_;
  std::vector<uint8_t> pool_;
  std::vector<int32_t> table_;
  const int32_t* tables_[kLayers] = {};
  int32_t counts_[kLayers] = {};
  PagedKv kv_;
};

// StoreKv writes each row as EncodeKvRow does; decode and prefill attention over those rows
// equal the double reference over the loaded rows (1e-5: the kernel reads the type right) and
// the reference over the fp32 inputs within the type's tolerance.
TEST_P(TypedAttentionTest, MatchesTheReferenceOverLoadedAndOriginalRows) {
  const KvDType t = GetParam();
  const int n = 37;
  const int32_t start[kKvHeads] = {0, 0};
  std::vector<float> k, v;
  Store(n, start, &k, &v, 11);
  // Rows as stored, and as loaded.
  std::vector<std::vector<float>> loaded_k(kKvHeads), loaded_v(kKvHeads);
  for (int h = 0; h < kKvHeads; ++h) {
    const PagedKvHead head = kv_.Head(kLayer, h);
    loaded_k[h].resize(static_cast<size_t>(n) * kHeadDim);
    loaded_v[h].resize(loaded_k[h].size());
    for (int s = 0; s < n; ++s) {
      LoadKvRow(head, 0, s, loaded_k[h].data() + s * kHeadDim);
      LoadKvRow(head, 1, s, loaded_v[h].data() + s * kHeadDim);
      const float* src = k.data() + (s * kKvHeads + h) * kHeadDim;
      const std::vector<float> want = RoundTrip(t, std::vector<float>(src, src + kHeadDim));
      ASSERT_EQ(std::vector<float>(loaded_k[h].begin() + s * kHeadDim,
                                   loaded_k[h].begin() + (s + 1) * kHeadDim),
                want)
          << "slot " << s;
    }
  }
  const int32_t lens[kKvHeads] = {n, n - 9};  // head 1 as after eviction
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const std::vector<float> q = Values(kHeads * kHeadDim, 5, 2.0f);
  const int stride = n + 3;
  std::vector<float> out(q.size()), probs(static_cast<size_t>(kHeads) * stride, -1.0f);
  backend_->DecodeAttention(kv_, kLayer, lens, q.data(), kHeads, scale, out.data(), probs.data(),
                            stride);
  std::vector<float> prefill(q.size());
  backend_->PrefillAttention(kv_, kLayer, lens, q.data(), 1, kHeads, scale, prefill.data());
  double worst = 0;
  for (int qh = 0; qh < kHeads; ++qh) {
    const int h = qh / (kHeads / kKvHeads);
    std::vector<const float*> lk, lv, ok, ov;
    for (int s = 0; s < lens[h]; ++s) {
      lk.push_back(loaded_k[h].data() + s * kHeadDim);
      lv.push_back(loaded_v[h].data() + s * kHeadDim);
      ok.push_back(k.data() + (s * kKvHeads + h) * kHeadDim);
      ov.push_back(v.data() + (s * kKvHeads + h) * kHeadDim);
    }
    std::vector<double> p_loaded, p_orig;
    const float* qq = q.data() + qh * kHeadDim;
    const auto ref_loaded = testing::RefAttend(qq, lk, lv, kHeadDim, scale, &p_loaded);
    const auto ref_orig = testing::RefAttend(qq, ok, ov, kHeadDim, scale, &p_orig);
    for (int d = 0; d < kHeadDim; ++d) {
      ASSERT_NEAR(out[qh * kHeadDim + d], ref_loaded[d], 1e-5) << "head " << qh;
      ASSERT_NEAR(prefill[qh * kHeadDim + d], ref_loaded[d], 1e-5) << "head " << qh;
      worst = std::max(worst, std::fabs(out[qh * kHeadDim + d] - ref_orig[d]));
    }
    for (int s = 0; s < lens[h]; ++s) {
      ASSERT_NEAR(probs[qh * stride + s], p_loaded[s], 1e-6);
      worst = std::max(worst, std::fabs(probs[qh * stride + s] - p_orig[s]));
    }
  }
  EXPECT_LE(worst, Tolerance(t)) << KvDTypeName(t);
  std::printf("%s: largest difference from fp32 K/V %.2e\n", KvDTypeName(t), worst);
}

// Compaction moves rows and scales bit for bit; host offload of a row (its bytes and scale)
// and restore give the same bytes.
TEST_P(TypedAttentionTest, CompactionMovesRowsAndScalesBitForBit) {
  const int n = 30;
  const int32_t start[kKvHeads] = {0, 0};
  std::vector<float> k, v;
  Store(n, start, &k, &v, 21);
  const std::vector<int32_t> keep = {0, 3, 4, 5, 11, 17, 18, 29};
  std::vector<std::vector<uint8_t>> want;
  const PagedKvHead head = kv_.Head(kLayer, 1);
  const int64_t rb = layout_.RowBytes();
  auto row_bytes = [&](int is_v, int s) {
    std::vector<uint8_t> b(head.RowData(is_v, s), head.RowData(is_v, s) + rb);
    if (GetParam() == KvDType::kInt8) {
      const uint8_t* sc = reinterpret_cast<const uint8_t*>(head.RowScale(is_v, s));
      b.insert(b.end(), sc, sc + 4);
    }
    return b;
  };
  for (int s : keep) {
    want.push_back(row_bytes(0, s));
    want.push_back(row_bytes(1, s));
  }
  HostMemory().CompactRows(head, keep.data(), static_cast<int>(keep.size()));
  for (size_t i = 0; i < keep.size(); ++i) {
    EXPECT_EQ(row_bytes(0, static_cast<int>(i)), want[2 * i]) << "K of kept " << keep[i];
    EXPECT_EQ(row_bytes(1, static_cast<int>(i)), want[2 * i + 1]) << "V of kept " << keep[i];
  }
}

// RerotateKeys on a typed key row equals the key stored at the new position, within the
// type's rounding (the row is widened, rotated and stored again).
TEST_P(TypedAttentionTest, RerotatedKeysMatchKeysStoredAtTheNewPosition) {
  const KvDType t = GetParam();
  const int n = 12;
  const int32_t start[kKvHeads] = {0, 0};
  std::vector<float> k, v;
  Store(n, start, &k, &v, 31);
  std::vector<int32_t> from(static_cast<size_t>(kLayers * kKvHeads * n)), to(from.size());
  for (int r = 0; r < kLayers * kKvHeads; ++r) {
    for (int s = 0; s < n; ++s) {
      from[r * n + s] = 5000 + 3 * s;
      to[r * n + s] = 40 + s;
    }
  }
  const int32_t lens[kLayers * kKvHeads] = {0, 0, n, n};  // layer 1 only
  RerotateArgs a;
  a.kv = kv_;
  a.lens = lens;
  a.from = from.data();
  a.to = to.data();
  a.stride = n;
  a.theta = 10000.0f;
  a.style = RopeStyle::kHalfSplit;
  backend_->RerotateKeys(a);
  double worst = 0;
  for (int h = 0; h < kKvHeads; ++h) {
    const PagedKvHead head = kv_.Head(kLayer, h);
    for (int s = 0; s < n; ++s) {
      std::vector<float> want(k.begin() + (s * kKvHeads + h) * kHeadDim,
                              k.begin() + (s * kKvHeads + h + 1) * kHeadDim);
      cpu::RerotateRow(want.data(), kHeadDim, 5000 + 3 * s, 40 + s, a.theta, a.style);
      std::vector<float> got(kHeadDim);
      LoadKvRow(head, 0, s, got.data());
      for (int d = 0; d < kHeadDim; ++d) {
        worst = std::max(worst, static_cast<double>(std::fabs(got[d] - want[d])));
      }
    }
  }
  // Two roundings of the type (stored, then stored again after the rotation) of rows in
  // [-1, 1] rotated pairwise (|x| <= sqrt 2).
  const double bound = t == KvDType::kF32    ? 1e-5
                       : t == KvDType::kBF16 ? 2 * std::sqrt(2.0) / 256
                       : t == KvDType::kF16  ? 2 * std::sqrt(2.0) / 2048
                                             : 2 * std::sqrt(2.0) / 254 + 1e-6;
  EXPECT_LE(worst, bound) << KvDTypeName(t);
}

INSTANTIATE_TEST_SUITE_P(Types, TypedAttentionTest,
                         ::testing::Values(KvDType::kF32, KvDType::kBF16, KvDType::kF16,
                                           KvDType::kInt8),
                         [](const auto& info) { return std::string(KvDTypeName(info.param)); });

}  // namespace
}  // namespace recall::kernels
