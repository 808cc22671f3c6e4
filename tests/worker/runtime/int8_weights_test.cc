// Int8 weights on the real stories260K (worker/model/quantize.h): teacher-forced over the
// reference implementation's golden text, the int8 model's next-token distributions stay
// close to the f32 model's (mean KL, top-1 agreement, printed); the weights read per token
// shrink to about a quarter of f32's; an engine that cannot run them says so by field.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cache/block_pool.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"
#include "tests/common/logits_compare.h"
#include "tests/common/stories260k.h"
#include "worker/model/load.h"
#include "worker/model/quantize.h"
#include "worker/model/random_model.h"
#include "worker/model/upload.h"
#include "worker/runtime/engine.h"
#include "worker/runtime/forward.h"

namespace recall::runtime {
namespace {

class Int8WeightsTest : public testing::Stories260KTest {};

// Next-token logits after every token of `tokens` (one decode step each).
std::vector<std::vector<float>> TeacherForced(const model::Model& m,
                                              const std::vector<int32_t>& tokens) {
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({1});
  const model::ModelConfig& c = m.config;
  auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16},
                                       c.n_layers * (c.max_seq_len / 16 + 1));
  EXPECT_TRUE(pool.ok()) << pool.status();
  ForwardPass forward(m, *backend, ForwardOptions{16});
  cache::SequenceCache seq(pool->get());
  std::vector<std::vector<float>> out;
  for (const int32_t t : tokens) {
    BatchItem item{&seq, &t, 1};
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    EXPECT_TRUE(forward.Run({&item, 1}, logits.data()).ok());
    out.push_back(std::move(logits));
  }
  return out;
}

TEST_F(Int8WeightsTest, NextTokenDistributionsStayCloseToF32OnTheGoldenText) {
  if (model_ == nullptr) return;
  std::ifstream in(
      testing::SharedPath("models/stories260K/golden_greedy_once_upon_a_time_n256.txt"));
  ASSERT_TRUE(in) << "golden text missing";
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> tokens = tok_->Encode(text.str(), /*add_bos=*/true);
  tokens.resize(std::min<size_t>(tokens.size(), model_->config.max_seq_len - 1));
  ASSERT_GT(tokens.size(), 200u);

  const auto want = TeacherForced(*model_, tokens);
  for (const bool embeddings : {true, false}) {
    auto int8 = model::LoadModel(testing::SharedPath(testing::kStoriesModel));
    ASSERT_TRUE(int8.ok()) << int8.status();
    ASSERT_TRUE(model::QuantizeWeightsInt8(**int8, {.embeddings = embeddings}).ok());
    const model::LayerWeights& l = (*int8)->layers[0];
    EXPECT_EQ(l.wq.dtype, kernels::DType::kI8);
    EXPECT_EQ(l.w_down.dtype, kernels::DType::kI8);
    EXPECT_EQ((*int8)->lm_head.dtype, kernels::DType::kI8);
    // stories260K's table is tied: quantized, one int8 copy serves both.
    EXPECT_EQ((*int8)->tok_embeddings.dtype,
              embeddings ? kernels::DType::kI8 : kernels::DType::kF32);
    EXPECT_EQ((*int8)->tok_embeddings.data == (*int8)->lm_head.data, embeddings);
    EXPECT_EQ(l.wq.bytes() * 4, model_->layers[0].wq.bytes());

    const auto got = TeacherForced(**int8, tokens);
    const testing::LogitsAgreement a = testing::CompareLogits(want, got);
    const double kl = a.mean_kl, top1 = a.top1;
    std::printf(
        "stories260K int8 vs f32 weights (embeddings %s), %zu golden tokens: mean KL "
        "%.5f, top-1 %.4f\n",
        embeddings ? "int8" : "f32", want.size(), kl, top1);
    EXPECT_LT(kl, 0.01);
    EXPECT_GE(top1, 0.95);
  }
}

// UploadModel (what a GPU rank runs on) carries int8 matrices with their scales and row sums:
// on the CPU backend with opaque memory (device-like), the uploaded model's logits are the
// host model's, bit for bit.
TEST_F(Int8WeightsTest, UploadedInt8WeightsGiveTheHostModelsLogits) {
  if (model_ == nullptr) return;
  ASSERT_TRUE(model::QuantizeWeightsInt8(*model_).ok());
  std::unique_ptr<kernels::Backend> opaque = kernels::CreateCpuBackend({1, true});
  ASSERT_FALSE(opaque->memory().host_accessible());
  auto uploaded = model::UploadModel(*model_, opaque->memory());
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ((*uploaded)->layers[0].wq.dtype, kernels::DType::kI8);
  EXPECT_NE((*uploaded)->layers[0].wq.scales, model_->layers[0].wq.scales);
  const model::ModelConfig& c = model_->config;
  std::vector<float> want(static_cast<size_t>(c.vocab_size)), got(want.size());
  for (const bool device : {false, true}) {
    std::unique_ptr<kernels::Backend> host = kernels::CreateCpuBackend({1});
    kernels::Backend& b = device ? *opaque : *host;
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16}, c.n_layers * 8,
                                         b.memory());
    ASSERT_TRUE(pool.ok()) << pool.status();
    ForwardPass forward(device ? **uploaded : *model_, b, ForwardOptions{16});
    cache::SequenceCache seq(pool->get());
    const std::vector<int32_t> tokens = {1, 403, 407, 261, 378, 14};
    BatchItem item{&seq, tokens.data(), static_cast<int>(tokens.size())};
    ASSERT_TRUE(forward.Run({&item, 1}, (device ? got : want).data()).ok());
  }
  EXPECT_EQ(got, want);
}

TEST_F(Int8WeightsTest, EnginesOfOneAndTwoCpuRanksTakeInt8Weights) {
  if (model_ == nullptr) return;
  ASSERT_TRUE(model::QuantizeWeightsInt8(*model_).ok());
  EngineOptions one;
  one.kv_cache_bytes = int64_t{8} << 20;
  one.kv_dtype = kernels::KvDType::kBF16;
  auto engine = Engine::Create(*model_, one);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // The start-up line names both types (the KV type was left to be inferred from the block
  // size).
  EXPECT_NE((*engine)->Summary().find("int8 weights; bf16 KV pool "), std::string::npos)
      << (*engine)->Summary();
  EngineOptions tp2 = one;
  tp2.tp = 2;
  auto group = Engine::Create(*model_, tp2);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_NE((*group)->Summary().find("int8 weights; bf16 KV pool "), std::string::npos)
      << (*group)->Summary();
}

// This process's resident bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The bf16 originals of the quantized matrices go back to the system: resident memory falls
// by at least 40% of their bytes (the int8 copies are half of them), and the model still runs.
TEST(Int8WeightsMemory, TheOriginalsAreGivenBack) {
  model::ModelConfig c;
  c.dim = 512;
  c.hidden_dim = 1536;
  c.n_layers = 8;
  c.n_heads = 8;
  c.n_kv_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 4096;
  c.max_seq_len = 64;
  auto m = model::MakeRandomModel(c, kernels::DType::kBF16, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  size_t originals = (*m)->lm_head.bytes();
  for (const model::LayerWeights& l : (*m)->layers) {
    for (const kernels::Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      originals += w->bytes();
    }
  }
  const int64_t before = ResidentBytes();
  ASSERT_TRUE(model::QuantizeWeightsInt8(**m).ok());
  const int64_t after = ResidentBytes();
  std::printf("bf16 originals %.1f MB; resident %.1f MB before quantizing, %.1f MB after\n",
              originals / 1e6, before / 1e6, after / 1e6);
  EXPECT_LE(after, before - static_cast<int64_t>(originals) * 2 / 5);
  const auto logits = TeacherForced(**m, {1, 2, 3});
  for (const std::vector<float>& l : logits) {
    for (const float v : l) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(Int8WeightsLoad, AnUnknownWeightTypeIsRefusedByField) {
  RECALL_REQUIRE_SHARED_FILE(testing::kStoriesModel);
  model::LoadOptions o;
  o.weight_dtype = "int4";
  o.model = testing::SharedPath(testing::kStoriesModel);
  o.tokenizer = testing::SharedPath(testing::kStoriesTokenizer);
  auto loaded = model::LoadAll(o);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("weight_dtype"), std::string::npos) << loaded.status();
  o.weight_dtype = "int8";
  loaded = model::LoadAll(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model->config.weight_dtype, kernels::DType::kI8);
}

}  // namespace
}  // namespace recall::runtime
