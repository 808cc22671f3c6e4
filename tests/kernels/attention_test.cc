// StoreKv / PrefillAttention / DecodeAttention over a paged KV cache: 4-token blocks, a
// shuffled block table, a different cache length per KV head (as after eviction), a new
// chunk appended after existing tokens, and GQA. References read a contiguous copy of each
// head's logical sequence and compute in double.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/reference.h"

namespace recall::kernels {
namespace {

constexpr float kSentinel = -777.0f;

// Param: (head_dim, query heads per KV head, tokens already cached in KV heads 0 and 1).
class PagedAttentionTest
    : public ::testing::TestWithParam<std::tuple<int, int, std::pair<int, int>>> {
 protected:
  static constexpr int kLayers = 2, kKvHeads = 2, kBlockTokens = 4, kPoolBlocks = 24;
  static constexpr int kLayer = 1;  // the layer under test (layer 0 has its own blocks)
  static constexpr int kNew = 6;    // tokens in the new chunk

  void SetUp() override {
    head_dim_ = std::get<0>(GetParam());
    n_heads_ = kKvHeads * std::get<1>(GetParam());
    start_slots_[0] = std::get<2>(GetParam()).first;
    start_slots_[1] = std::get<2>(GetParam()).second;
    for (int h = 0; h < kKvHeads; ++h) kv_lens_[h] = start_slots_[h] + kNew;
    layout_ = PagedKvLayout{kLayers, kKvHeads, head_dim_, kBlockTokens};
    pool_.assign(kPoolBlocks * layout_.BlockFloats(), kSentinel);
    expected_pool_ = pool_;
    std::mt19937 rng(head_dim_ * 10 + n_heads_ + start_slots_[0]);
    // Shuffled: logical block b of kLayer lives in pool block table_[b]; layer 0's table
    // holds other blocks, which no kernel call on kLayer may touch.
    std::vector<int32_t> ids(kPoolBlocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const size_t blocks = (std::max(kv_lens_[0], kv_lens_[1]) + kBlockTokens - 1) / kBlockTokens;
    table_.assign(ids.begin(), ids.begin() + blocks);
    other_table_.assign(ids.begin() + blocks, ids.begin() + 2 * blocks);
    tables_[0] = other_table_.data();
    tables_[kLayer] = table_.data();
    counts_[0] = counts_[kLayer] = static_cast<int32_t>(blocks);
    kv_ = PagedKv{layout_, pool_.data(), tables_, counts_};
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (int h = 0; h < kKvHeads; ++h) {
      keys_[h].resize(static_cast<size_t>(kv_lens_[h]) * head_dim_);
      values_[h].resize(keys_[h].size());
      for (float& x : keys_[h]) x = uni(rng);
      for (float& x : values_[h]) x = uni(rng);
      // The existing tokens are written straight into the pool, by hand.
      for (int s = 0; s < kv_lens_[h]; ++s) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          const int64_t at = Address(h, is_v, s);
          const float* src = (is_v ? values_[h] : keys_[h]).data() + s * head_dim_;
          std::copy(src, src + head_dim_, expected_pool_.begin() + at);
          if (s < start_slots_[h]) std::copy(src, src + head_dim_, pool_.begin() + at);
        }
      }
    }
  }

  // Pool offset of (kLayer, head, K/V, slot), computed from the layout definition.
  int64_t Address(int h, int is_v, int slot) const {
    const int64_t block = table_[slot / kBlockTokens];
    return block * layout_.BlockFloats() +
           (((int64_t{h} * 2 + is_v) * kBlockTokens) + slot % kBlockTokens) * head_dim_;
  }

  // The new chunk as StoreKv takes it: [kNew, kKvHeads, head_dim].
  void StoreNewChunk() {
    std::vector<float> k(static_cast<size_t>(kNew) * kKvHeads * head_dim_), v(k.size());
    for (int i = 0; i < kNew; ++i) {
      for (int h = 0; h < kKvHeads; ++h) {
        const float* ks = keys_[h].data() + (start_slots_[h] + i) * head_dim_;
        const float* vs = values_[h].data() + (start_slots_[h] + i) * head_dim_;
        std::copy(ks, ks + head_dim_, k.begin() + (i * kKvHeads + h) * head_dim_);
        std::copy(vs, vs + head_dim_, v.begin() + (i * kKvHeads + h) * head_dim_);
      }
    }
    backend_->StoreKv(kv_, kLayer, k.data(), v.data(), kNew, start_slots_);
  }

  std::vector<double> Reference(int h, const float* q, int len, std::vector<double>* probs) {
    std::vector<const float*> ks, vs;
    for (int s = 0; s < len; ++s) {
      ks.push_back(keys_[h].data() + s * head_dim_);
      vs.push_back(values_[h].data() + s * head_dim_);
    }
    return testing::RefAttend(q, ks, vs, head_dim_, scale(), probs);
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim_)); }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend({2});
  int head_dim_ = 0, n_heads_ = 0;
  PagedKvLayout layout_;
  std::vector<float> pool_, expected_pool_;
  std::vector<int32_t> table_, other_table_;
  const int32_t* tables_[kLayers] = {};
  int32_t counts_[kLayers] = {};
  PagedKv kv_;
  // KV heads hold different numbers of tokens (as after eviction); both get kNew more.
  int32_t start_slots_[kKvHeads] = {};
  int32_t kv_lens_[kKvHeads] = {};
  std::vector<float> keys_[kKvHeads], values_[kKvHeads];  // logical [len, head_dim]
};

// Scenario: StoreKv writes exactly the new rows at their paged addresses and nothing else.
TEST_P(PagedAttentionTest, StoreKvWritesOnlyTheNewRows) {
  StoreNewChunk();
  EXPECT_EQ(pool_, expected_pool_);
}

// Scenario: the new chunk's queries attend causally to the existing tokens plus the chunk's
// own earlier tokens: query i of KV head h sees slots [0, kv_lens[h] - kNew + i].
TEST_P(PagedAttentionTest, PrefillChunkAfterExistingCache) {
  StoreNewChunk();
  const std::vector<float> q = testing::RandomVector(kNew * n_heads_ * head_dim_, 3);
  std::vector<float> out(q.size(), kSentinel);
  backend_->PrefillAttention(kv_, kLayer, kv_lens_, q.data(), kNew, n_heads_, scale(), out.data());
  const int group = n_heads_ / kKvHeads;
  for (int i = 0; i < kNew; ++i) {
    for (int qh = 0; qh < n_heads_; ++qh) {
      const int h = qh / group;
      const int64_t off = (i * n_heads_ + qh) * head_dim_;
      const std::vector<double> ref =
          Reference(h, q.data() + off, kv_lens_[h] - kNew + i + 1, nullptr);
      for (int d = 0; d < head_dim_; ++d) {
        ASSERT_NEAR(out[off + d], ref[d], 1e-5) << "query " << i << " head " << qh;
      }
    }
  }
}

// Scenario: one decode query per head over lengths differing per KV head; probabilities go
// to rows of a stride longer than any length, match the reference, sum to 1 and leave the rest of
// the row alone; the output is the same with and without probs.
TEST_P(PagedAttentionTest, DecodeWritesProbabilities) {
  StoreNewChunk();
  const int stride = std::max(kv_lens_[0], kv_lens_[1]) + 5;
  const std::vector<float> q = testing::RandomVector(n_heads_ * head_dim_, 4);
  std::vector<float> out(q.size()), out_no_probs(q.size());
  std::vector<float> probs(static_cast<size_t>(n_heads_) * stride, kSentinel);
  backend_->DecodeAttention(kv_, kLayer, kv_lens_, q.data(), n_heads_, scale(), out.data(),
                            probs.data(), stride);
  backend_->DecodeAttention(kv_, kLayer, kv_lens_, q.data(), n_heads_, scale(), out_no_probs.data(),
                            nullptr, 0);
  EXPECT_EQ(out, out_no_probs);
  const int group = n_heads_ / kKvHeads;
  for (int qh = 0; qh < n_heads_; ++qh) {
    const int h = qh / group;
    std::vector<double> ref_probs;
    const std::vector<double> ref =
        Reference(h, q.data() + qh * head_dim_, kv_lens_[h], &ref_probs);
    double sum = 0;
    for (int s = 0; s < stride; ++s) {
      const float p = probs[qh * stride + s];
      if (s < kv_lens_[h]) {
        EXPECT_NEAR(p, ref_probs[s], 1e-6) << "head " << qh << " slot " << s;
        sum += p;
      } else {
        EXPECT_EQ(p, kSentinel) << "head " << qh << " slot " << s;
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    for (int d = 0; d < head_dim_; ++d) {
      EXPECT_NEAR(out[qh * head_dim_ + d], ref[d], 1e-5) << "head " << qh;
    }
  }
}

// Scenario: a prefill of one token is the same computation as decode: identical bits.
TEST_P(PagedAttentionTest, SingleTokenPrefillEqualsDecode) {
  StoreNewChunk();
  const std::vector<float> q = testing::RandomVector(n_heads_ * head_dim_, 5);
  std::vector<float> a(q.size()), b(q.size());
  backend_->PrefillAttention(kv_, kLayer, kv_lens_, q.data(), 1, n_heads_, scale(), a.data());
  backend_->DecodeAttention(kv_, kLayer, kv_lens_, q.data(), n_heads_, scale(), b.data(), nullptr,
                            0);
  EXPECT_EQ(a, b);
}

// Cached lengths (5, 2) stay within one 16-key group; (29, 40) span several groups and
// blocks, with partial groups at the end.
INSTANTIATE_TEST_SUITE_P(HeadDimGroupAndLength, PagedAttentionTest,
                         ::testing::Combine(::testing::Values(8, 20, 64), ::testing::Values(1, 2),
                                            ::testing::Values(std::pair{5, 2}, std::pair{29, 40})),
                         [](const auto& info) {
                           return "hd" + std::to_string(std::get<0>(info.param)) + "_gqa" +
                                  std::to_string(std::get<1>(info.param)) + "_cached" +
                                  std::to_string(std::get<2>(info.param).first) + "_" +
                                  std::to_string(std::get<2>(info.param).second);
                         });

}  // namespace
}  // namespace recall::kernels
