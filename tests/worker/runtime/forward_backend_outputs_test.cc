// ForwardPass outputs that stay in backend memory: the next token picked where the logits
// are (BatchItem::pick: greedy and sampled) and decode probabilities left for an evictor that steps
// on the backend (BatchItem::probs_on_backend), on host memory and on opaque memory (the device
// code paths on the CPU), against a plain run of the same batch.
#include <algorithm>
#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/sampling.h"
#include "tests/common/tiny_model.h"
#include "worker/model/random_model.h"
#include "worker/runtime/forward.h"

namespace recall::runtime {
namespace {

constexpr int kVocab = 97, kItems = 3;

struct Rig {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<cache::BlockPool> pool;
  std::unique_ptr<ForwardPass> forward;
  std::vector<std::unique_ptr<cache::SequenceCache>> seqs;
};

class ForwardBackendOutputsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto m = model::MakeRandomModel(testing::TinyModelConfig(2, 128), kernels::DType::kF32, 7);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }

  // Three sequences with prompts of 9, 14 and 20 tokens.
  Rig Make(bool opaque) {
    Rig r;
    kernels::CpuBackendOptions bo;
    bo.num_threads = 2;
    bo.opaque_memory = opaque;
    r.backend = kernels::CreateCpuBackend(bo);
    const model::ModelConfig& c = model_->config;
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 4}, 64,
                                         r.backend->memory());
    EXPECT_TRUE(pool.ok());
    r.pool = std::move(*pool);
    r.forward = std::make_unique<ForwardPass>(*model_, *r.backend, ForwardOptions{64});
    for (int i = 0; i < kItems; ++i) {
      r.seqs.push_back(std::make_unique<cache::SequenceCache>(r.pool.get()));
      std::vector<int32_t> t(static_cast<size_t>(9 + 5 * i + (i == 2)));
      for (size_t j = 0; j < t.size(); ++j)
        t[j] = static_cast<int32_t>((j * 31 + i * 17 + 5) % kVocab);
      BatchItem item{r.seqs.back().get(), t.data(), static_cast<int>(t.size()), false};
      EXPECT_TRUE(r.forward->Run({&item, 1}, nullptr).ok());
    }
    return r;
  }

  std::unique_ptr<model::Model> model_;
};

TEST_P(ForwardBackendOutputsTest, PicksAndBackendProbsEqualAPlainRun) {
  const bool opaque = GetParam();
  const model::ModelConfig& c = model_->config;
  const int64_t stride = 32;
  const size_t rows = static_cast<size_t>(c.n_layers) * c.n_heads;
  const int32_t tokens[kItems] = {3, 50, 77};

  Rig plain = Make(false);
  std::vector<float> want_logits(kItems * kVocab);
  std::vector<std::vector<float>> want_probs(kItems, std::vector<float>(rows * stride, 0.0f));
  std::vector<BatchItem> items(kItems);
  for (int i = 0; i < kItems; ++i) {
    items[i] = BatchItem{plain.seqs[i].get(), &tokens[i], 1, true, want_probs[i].data(), stride};
  }
  ASSERT_TRUE(plain.forward->Run(items, want_logits.data()).ok());

  Rig rig = Make(opaque);
  std::vector<float> logits(kItems * kVocab, -123.0f);
  int32_t picked[kItems] = {-1, -1, -1};
  // Item 0 greedy, item 2 sampled (temperature, top-k, a draw), item 1 without a pick.
  kernels::SamplingParams sampled;
  sampled.temperature = 1.3f;
  sampled.top_k = 20;
  const float draw = 0.61f;
  for (int i = 0; i < kItems; ++i) {
    items[i] = BatchItem{rig.seqs[i].get(), &tokens[i], 1};
    items[i].probs_on_backend = i != 1;
    if (i != 1) items[i].pick = &picked[i];
  }
  items[2].sampling = &sampled;
  items[2].draw = draw;
  ASSERT_TRUE(rig.forward->Run(items, logits.data()).ok());

  for (int i = 0; i < kItems; ++i) {
    const float* want = want_logits.data() + i * kVocab;
    const float* got = logits.data() + i * kVocab;
    if (i == 1) {
      for (int v = 0; v < kVocab; ++v) ASSERT_FLOAT_EQ(got[v], want[v]) << "item 1 logit " << v;
      int64_t s = -1;
      EXPECT_EQ(rig.forward->backend_probs(1, &s), nullptr) << "item 1 did not ask for them";
      continue;
    }
    if (i == 0) {
      EXPECT_EQ(picked[i], kernels::cpu::ArgMax(want, kVocab)) << "item 0, greedy";
    } else {
      std::vector<float> row(want, want + kVocab);
      kernels::cpu::Sampler sampler;
      EXPECT_EQ(picked[i], sampler.Pick(row.data(), kVocab, sampled, draw)) << "item 2, sampled";
    }
    if (opaque) {
      EXPECT_EQ(got[0], -123.0f) << "item " << i << ": its logits stay in backend memory";
    }
    int64_t s = 0;
    const float* probs = rig.forward->backend_probs(static_cast<size_t>(i), &s);
    ASSERT_NE(probs, nullptr);
    const int len = rig.seqs[i]->max_length();
    EXPECT_EQ(s, (len + 15) / 16 * 16) << "the item's length rounded up to 16";
    std::vector<float> got_probs(rows * static_cast<size_t>(s));
    rig.backend->memory().CopyOut(got_probs.data(), probs, got_probs.size() * sizeof(float));
    for (size_t row = 0; row < rows; ++row) {
      for (int slot = 0; slot < len; ++slot) {
        ASSERT_FLOAT_EQ(got_probs[row * s + slot], want_probs[i][row * stride + slot])
            << "item " << i << " row " << row << " slot " << slot;
      }
    }
  }
}

TEST_P(ForwardBackendOutputsTest, BackendProbsNeedADecodeStepAndExcludeHostProbs) {
  Rig rig = Make(GetParam());
  const int32_t two[2] = {1, 2};
  BatchItem item{rig.seqs[0].get(), two, 2};
  item.probs_on_backend = true;
  EXPECT_EQ(rig.forward->Run({&item, 1}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> probs(1024);
  BatchItem both{rig.seqs[0].get(), two, 1, true, probs.data(), 64};
  both.probs_on_backend = true;
  const absl::Status st = rig.forward->Run({&both, 1}, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("exclusive"), std::string::npos) << st;
  EXPECT_EQ(rig.seqs[0]->next_position(), 9) << "nothing was appended";
}

TEST_P(ForwardBackendOutputsTest, APickWithARepetitionPenaltyIsRefused) {
  Rig rig = Make(GetParam());
  std::vector<float> logits(kVocab);
  const int32_t token = 4;
  int32_t picked = -1;
  kernels::SamplingParams penalised;
  penalised.repetition_penalty = 1.2f;
  BatchItem item{rig.seqs[0].get(), &token, 1};
  item.pick = &picked;
  item.sampling = &penalised;
  const absl::Status st = rig.forward->Run({&item, 1}, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("repetition penalty"), std::string::npos) << st;
  EXPECT_EQ(picked, -1);
  EXPECT_EQ(rig.seqs[0]->next_position(), 9) << "nothing was appended";
}

INSTANTIATE_TEST_SUITE_P(Memory, ForwardBackendOutputsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "opaque" : "host"; });

}  // namespace
}  // namespace recall::runtime
