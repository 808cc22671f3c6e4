// ForwardPass over a random-weight model: batching, chunking and cache accounting.
#include "worker/runtime/forward.h"

#include <algorithm>
#include <cmath>

#include "cache/block_pool.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "worker/model/random_model.h"

namespace recall::runtime {
namespace {

model::ModelConfig TinyConfig() { return testing::TinyModelConfig(2, 128); }

class ForwardTest : public ::testing::TestWithParam<kernels::DType> {
 protected:
  void SetUp() override {
    auto m = model::MakeRandomModel(TinyConfig(), GetParam(), 7);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    backend_ = kernels::CreateCpuBackend({2});
    const auto& c = model_->config;
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 4}, 64);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
    forward_ = std::make_unique<ForwardPass>(*model_, *backend_, ForwardOptions{64});
  }
  std::vector<int32_t> Tokens(int n, int salt) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = (i * 31 + salt * 17 + 5) % 97;
    return t;
  }
  // Runs tokens through `seq` in chunks of `chunk`; returns the last token's logits.
  std::vector<float> Prefill(cache::SequenceCache& seq, const std::vector<int32_t>& t, int chunk) {
    std::vector<float> logits(97);
    for (size_t s = 0; s < t.size(); s += chunk) {
      BatchItem item{&seq, t.data() + s, static_cast<int>(std::min<size_t>(chunk, t.size() - s))};
      EXPECT_TRUE(forward_->Run({&item, 1}, logits.data()).ok());
    }
    return logits;
  }
  static int Argmax(const float* x, int n) {
    return static_cast<int>(std::max_element(x, x + n) - x);
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
};

TEST_P(ForwardTest, ChunkedPrefillMatchesTokenByToken) {
  const std::vector<int32_t> t = Tokens(37, 1);
  cache::SequenceCache a(pool_.get()), b(pool_.get());
  const std::vector<float> whole = Prefill(a, t, 16);
  const std::vector<float> steps = Prefill(b, t, 1);
  for (int i = 0; i < 97; ++i) EXPECT_NEAR(whole[i], steps[i], 1e-3f) << "logit " << i;
  EXPECT_EQ(Argmax(whole.data(), 97), Argmax(steps.data(), 97));
  EXPECT_EQ(a.next_position(), 37);
  EXPECT_EQ(a.length(1, 1), 37);
}

TEST_P(ForwardTest, BatchedDecodeEqualsOneByOne) {
  // Three sequences of different lengths, greedy-decoded 12 steps alone and batched.
  const std::vector<std::vector<int32_t>> prompts = {Tokens(5, 2), Tokens(19, 3), Tokens(1, 4)};
  std::vector<std::vector<int32_t>> alone(3), batched(3);
  for (int s = 0; s < 3; ++s) {
    cache::SequenceCache seq(pool_.get());
    std::vector<float> logits = Prefill(seq, prompts[s], 8);
    for (int step = 0; step < 12; ++step) {
      alone[s].push_back(Argmax(logits.data(), 97));
      BatchItem item{&seq, &alone[s].back(), 1};
      ASSERT_TRUE(forward_->Run({&item, 1}, logits.data()).ok());
    }
  }
  std::vector<std::unique_ptr<cache::SequenceCache>> seqs;
  std::vector<float> logits(3 * 97);
  for (int s = 0; s < 3; ++s) {
    seqs.push_back(std::make_unique<cache::SequenceCache>(pool_.get()));
    std::vector<float> l = Prefill(*seqs[s], prompts[s], 8);
    std::copy(l.begin(), l.end(), logits.begin() + s * 97);
  }
  for (int step = 0; step < 12; ++step) {
    std::vector<BatchItem> items;
    for (int s = 0; s < 3; ++s) {
      batched[s].push_back(Argmax(logits.data() + s * 97, 97));
      items.push_back({seqs[s].get(), &batched[s].back(), 1});
    }
    ASSERT_TRUE(forward_->Run(items, logits.data()).ok());
  }
  EXPECT_EQ(alone, batched);
}

TEST_P(ForwardTest, MixedBatchOfPrefillChunkAndDecodeStep) {
  // Sequence A decodes while sequence B prefills in the same batch; each matches its solo run.
  const std::vector<int32_t> pa = Tokens(9, 5), pb = Tokens(13, 6);
  cache::SequenceCache a1(pool_.get()), b1(pool_.get());
  std::vector<float> la = Prefill(a1, pa, 9);
  const int32_t next_a = Argmax(la.data(), 97);
  BatchItem solo_a{&a1, &next_a, 1};
  ASSERT_TRUE(forward_->Run({&solo_a, 1}, la.data()).ok());
  const std::vector<float> lb = Prefill(b1, pb, 13);

  cache::SequenceCache a2(pool_.get()), b2(pool_.get());
  Prefill(a2, pa, 9);
  std::vector<float> both(2 * 97);
  std::vector<BatchItem> items = {{&a2, &next_a, 1}, {&b2, pb.data(), 13}};
  ASSERT_TRUE(forward_->Run(items, both.data()).ok());
  for (int i = 0; i < 97; ++i) {
    EXPECT_NEAR(both[i], la[i], 1e-3f);
    EXPECT_NEAR(both[97 + i], lb[i], 1e-3f);
  }
}

TEST_P(ForwardTest, BadBatchesAreRejectedWithoutTouchingCaches) {
  cache::SequenceCache seq(pool_.get());
  const std::vector<int32_t> bad = {3, 97};
  BatchItem item{&seq, bad.data(), 2};
  absl::Status st = forward_->Run({&item, 1}, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token id 97"), std::string::npos) << st.message();
  EXPECT_EQ(seq.next_position(), 0);

  const std::vector<int32_t> many = Tokens(65, 1);
  item = {&seq, many.data(), 65};
  st = forward_->Run({&item, 1}, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_batch_tokens 64"), std::string::npos) << st.message();
  EXPECT_EQ(seq.num_blocks(), 0);
}

TEST_P(ForwardTest, PoolExhaustionLeavesEveryCacheAsItWas) {
  auto small = cache::BlockPool::Create({2, 2, 16, 4}, 2 * 3);  // 12 slots in both layers
  ASSERT_TRUE(small.ok());
  cache::SequenceCache a(small->get()), b(small->get());
  const std::vector<int32_t> t = Tokens(8, 1);
  BatchItem first{&a, t.data(), 5};  // 2 blocks per layer
  ASSERT_TRUE(forward_->Run({&first, 1}, nullptr).ok());
  // b: 1 block per layer, a: +1 per layer.
  std::vector<BatchItem> items = {{&b, t.data(), 3}, {&a, t.data(), 4}};
  const absl::Status st = forward_->Run(items, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.next_position(), 5);
  EXPECT_EQ(a.num_blocks(), 2 * 2);
  EXPECT_EQ(b.num_blocks(), 0) << "blocks taken for b must be given back";
  EXPECT_EQ((*small)->free_blocks(), 2);
}

TEST_P(ForwardTest, ContextLimitIsEnforced) {
  cache::SequenceCache seq(pool_.get());
  const std::vector<int32_t> t = Tokens(64, 1);
  Prefill(seq, t, 64);
  Prefill(seq, t, 64);  // exactly 128 = max_seq_len
  BatchItem one{&seq, t.data(), 1};
  const absl::Status st = forward_->Run({&one, 1}, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("context length 128"), std::string::npos) << st.message();
}

TEST_P(ForwardTest, DecodeAttentionProbabilitiesAreReturnedPerLayerAndHead) {
  cache::SequenceCache seq(pool_.get());
  Prefill(seq, Tokens(10, 3), 10);
  const int32_t tok = 4;
  const int64_t stride = 16;
  std::vector<float> probs(2 * 4 * stride, -1.0f);
  BatchItem item{&seq, &tok, 1, true, probs.data(), stride};
  std::vector<float> logits(97);
  ASSERT_TRUE(forward_->Run({&item, 1}, logits.data()).ok());
  for (int lh = 0; lh < 8; ++lh) {
    double sum = 0;
    for (int s = 0; s < 11; ++s) sum += probs[lh * stride + s];
    EXPECT_NEAR(sum, 1.0, 1e-5) << "layer*head " << lh;
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, ForwardTest,
                         ::testing::Values(kernels::DType::kF32, kernels::DType::kBF16,
                                           kernels::DType::kF16),
                         [](const auto& info) { return kernels::DTypeName(info.param); });

}  // namespace
}  // namespace recall::runtime
