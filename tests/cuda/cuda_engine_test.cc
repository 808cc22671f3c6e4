// The engine end to end on a GPU: stories260K's greedy text equals llama2.c's golden output;
// a batch of sequences gives the CPU's logits and attention probabilities; an eviction run
// keeps, in every layer and KV head, the token positions the CPU keeps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "kernels/cpu/sampling.h"
#include "kernels/fp8.h"
#include "tests/common/logits_compare.h"
#include "tests/common/test_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "worker/model/file_storage.h"
#include "worker/model/loader.h"
#include "worker/model/quantize.h"
#include "worker/model/upload.h"
#include "worker/offline/generator.h"
#include "worker/offline/sequence.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::offline {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

// A model, its tokenizer and one engine (backend, weights, pool, forward pass) per device.
class CudaEngineTest : public kernels::CudaTest {
 protected:
  struct Engine {
    const model::Model* model = nullptr;
    std::unique_ptr<model::Model> uploaded;
    std::unique_ptr<cache::BlockPool> pool;
    std::unique_ptr<runtime::ForwardPass> forward;
  };

  void SetUp() override {
    kernels::CudaTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    RECALL_REQUIRE_SHARED_FILE(kModel);
    auto model = model::LoadLlama2c(testing::SharedPath(kModel));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = model::LoadTokenizer(testing::SharedPath(kTokenizer), 512);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
    MakeEngine(*cpu_, false, cpu_engine_);
    MakeEngine(*gpu_, true, gpu_engine_);
  }

  void MakeEngine(kernels::Backend& backend, bool upload, Engine& e) {
    const model::ModelConfig& c = model_->config;
    e.model = model_.get();
    if (upload) {
      auto up = model::UploadModel(*model_, backend.memory());
      ASSERT_TRUE(up.ok()) << up.status();
      e.uploaded = std::move(*up);
      e.model = e.uploaded.get();
    }
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16},
                                         4 * c.n_layers * ((c.max_seq_len + 15) / 16),
                                         backend.memory());
    ASSERT_TRUE(pool.ok()) << pool.status();
    e.pool = std::move(*pool);
    e.forward =
        std::make_unique<runtime::ForwardPass>(*e.model, backend, runtime::ForwardOptions{512});
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<model::Tokenizer> tok_;
  Engine cpu_engine_, gpu_engine_;
};

std::string Golden(const char* file) {
  std::string text = testing::ReadFileOrEmpty(testing::SharedPath(file));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

TEST_F(CudaEngineTest, GreedyTextEqualsRunCGolden) {
  struct Case { const char* prompt; int steps; const char* golden; int chunk; };
  for (const Case& gc :
       {Case{"Once upon a time", 256, "models/stories260K/golden_greedy_once_upon_a_time_n256.txt", 256},
        Case{"Once upon a time", 256, "models/stories260K/golden_greedy_once_upon_a_time_n256.txt", 1},
        Case{"", 512, "models/stories260K/golden_greedy_noprompt_n512.txt", 256}}) {
    const std::vector<int32_t> prompt = tok_->Encode(gc.prompt, /*add_bos=*/true);
    GenerateOptions options;
    options.sampling.temperature = 0.0f;
    options.max_tokens = gc.steps - static_cast<int>(prompt.size()) + 1;
    options.stop_token_ids = {1};
    options.prefill_chunk = gc.chunk;
    auto result = Generate(*gpu_engine_.forward, *gpu_engine_.pool, *tok_, prompt, options);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), result->tokens.begin(), result->tokens.end());
    EXPECT_EQ(tok_->Decode(all), Golden(gc.golden)) << "prompt '" << gc.prompt << "' chunk "
                                                    << gc.chunk;
    EXPECT_EQ(gpu_engine_.pool->free_blocks(), gpu_engine_.pool->num_blocks());
  }
  // The decode steps (and the chunk-1 prefill) ran as CUDA graphs.
  const runtime::StepGraphs& graphs = gpu_engine_.forward->step_graphs();
  EXPECT_TRUE(graphs.enabled()) << "the first graph passed its check";
  EXPECT_GT(graphs.replays(), 500);
}

// Decode steps replayed from CUDA graphs give the logits and probabilities of the same steps
// launched op by op, bit for bit, while the batch changes shape and the caches grow past
// blocks and length buckets.
TEST_F(CudaEngineTest, DecodeStepsAsGraphsEqualStepsLaunchedOpByOp) {
  const model::ModelConfig& c = model_->config;
  runtime::ForwardPass direct(
      *gpu_engine_.model, *gpu_,
      runtime::ForwardOptions{.max_batch_tokens = 512, .step_graphs = false});
  runtime::ForwardPass* passes[2] = {gpu_engine_.forward.get(), &direct};
  const std::vector<std::vector<int32_t>> prompts = {
      tok_->Encode("Once upon a time", true), tok_->Encode("The cat sat on the mat and", true),
      tok_->Encode("Lily", true)};
  std::vector<std::unique_ptr<cache::SequenceCache>> caches[2];
  for (int p = 0; p < 2; ++p) {
    for (const auto& prompt : prompts) {
      caches[p].push_back(std::make_unique<cache::SequenceCache>(gpu_engine_.pool.get()));
      runtime::BatchItem item{caches[p].back().get(), prompt.data(),
                              static_cast<int>(prompt.size()), false};
      ASSERT_TRUE(passes[p]->Run({&item, 1}, nullptr).ok());
    }
  }
  const int64_t stride = 256;
  std::vector<int32_t> next = {5, 6, 7};
  for (int s = 0; s < 150; ++s) {
    // Every seventh step without the second sequence.
    const std::vector<int> which = s % 7 == 6 ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2};
    std::vector<float> logits[2], probs[2];
    for (int p = 0; p < 2; ++p) {
      logits[p].assign(which.size() * c.vocab_size, 0.0f);
      probs[p].assign(static_cast<size_t>(c.n_layers) * c.n_heads * stride, 0.0f);
      std::vector<runtime::BatchItem> batch(which.size());
      for (size_t k = 0; k < which.size(); ++k) {
        batch[k] = runtime::BatchItem{caches[p][which[k]].get(), &next[which[k]], 1};
        if (which[k] == 1) {
          batch[k].attn_probs = probs[p].data();
          batch[k].probs_stride = stride;
        }
      }
      const absl::Status st = passes[p]->Run(batch, logits[p].data());
      ASSERT_TRUE(st.ok()) << "step " << s << ": " << st;
    }
    ASSERT_EQ(logits[0], logits[1]) << "step " << s;
    ASSERT_EQ(probs[0], probs[1]) << "step " << s;
    for (size_t k = 0; k < which.size(); ++k) {
      next[which[k]] = kernels::cpu::ArgMax(logits[1].data() + k * c.vocab_size, c.vocab_size);
    }
  }
  const runtime::StepGraphs& graphs = gpu_engine_.forward->step_graphs();
  EXPECT_TRUE(graphs.enabled());
  EXPECT_GE(graphs.recorded(), 4) << "per batch shape and length bucket";
  EXPECT_GE(graphs.replays(), 100);
  EXPECT_EQ(direct.step_graphs().recorded(), 0);
}

// Three sequences of different lengths prefilled in one batch, then decoded together with
// one of them asking for attention probabilities: logits and probabilities match the CPU's.
TEST_F(CudaEngineTest, BatchedStepsMatchTheCpu) {
  const model::ModelConfig& c = model_->config;
  const std::vector<std::vector<int32_t>> prompts = {
      tok_->Encode("Once upon a time", true), tok_->Encode("The cat sat on the mat and", true),
      tok_->Encode("Lily", true)};
  const int64_t stride = 64;
  std::map<int, std::vector<float>> logits, probs;
  for (Engine* e : {&cpu_engine_, &gpu_engine_}) {
    std::vector<std::unique_ptr<cache::SequenceCache>> caches;
    for (size_t i = 0; i < prompts.size(); ++i) {
      caches.push_back(std::make_unique<cache::SequenceCache>(e->pool.get()));
    }
    std::vector<runtime::BatchItem> batch(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      batch[i].cache = caches[i].get();
      batch[i].tokens = prompts[i].data();
      batch[i].n = static_cast<int>(prompts[i].size());
    }
    std::vector<float>& lg = logits[e == &gpu_engine_];
    std::vector<float> step(prompts.size() * c.vocab_size);
    ASSERT_TRUE(e->forward->Run(batch, step.data()).ok());
    lg.insert(lg.end(), step.begin(), step.end());
    std::vector<float>& pr = probs[e == &gpu_engine_];
    for (int s = 0; s < 6; ++s) {
      std::vector<int32_t> next(prompts.size());
      std::vector<float> p(static_cast<size_t>(c.n_layers) * c.n_heads * stride, 0.0f);
      for (size_t i = 0; i < prompts.size(); ++i) {
        next[i] = (17 * s + 5 * static_cast<int>(i)) % c.vocab_size;  // the same on both
        batch[i].tokens = &next[i];
        batch[i].n = 1;
        batch[i].attn_probs = i == 1 ? p.data() : nullptr;
        batch[i].probs_stride = i == 1 ? stride : 0;
      }
      absl::Status st = e->forward->Run(batch, step.data());
      ASSERT_TRUE(st.ok()) << st;
      lg.insert(lg.end(), step.begin(), step.end());
      // Only the slots the sequence holds are defined.
      const int len = caches[1]->max_length();
      for (int r = 0; r < c.n_layers * c.n_heads; ++r) {
        pr.insert(pr.end(), p.begin() + r * stride, p.begin() + r * stride + len);
      }
    }
  }
  EXPECT_LT(kernels::RelErr(logits[1], logits[0]), 1e-4);
  EXPECT_LT(kernels::RelErr(probs[1], probs[0]), 1e-4);
}

// (layer, KV head) -> positions of the kept slots.
using KeepSets = std::map<std::pair<int, int>, std::vector<int32_t>>;

// With bf16, f16 and int8 KV caches the GPU engine gives the CPU engine's logits for the same
// token stream (the goldens' text, teacher-forced), and a lazy-eviction run on those caches
// keeps what the CPU keeps. Each side rounds the same values into the same type, so only
// the f32 arithmetic before the rounding differs.
TEST_F(CudaEngineTest, TypedKvCachesDecodeAsTheCpuDoes) {
  const model::ModelConfig& c = model_->config;
  const std::vector<int32_t> stream = tok_->Encode(
      Golden("models/stories260K/golden_greedy_once_upon_a_time_n256.txt"), /*add_bos=*/true);
  ASSERT_GT(stream.size(), 120u);
  for (const kernels::KvDType dtype :
       {kernels::KvDType::kBF16, kernels::KvDType::kF16, kernels::KvDType::kInt8}) {
    const char* name = kernels::KvDTypeName(dtype);
    std::map<int, std::vector<float>> logits;
    for (kernels::Backend* b : {cpu_.get(), gpu_.get()}) {
      const int key = b == gpu_.get();
      Engine& e = key ? gpu_engine_ : cpu_engine_;
      auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16, dtype},
                                           4 * c.n_layers * ((c.max_seq_len + 15) / 16),
                                           b->memory());
      ASSERT_TRUE(pool.ok()) << pool.status();
      cache::SequenceCache cache(pool->get());
      runtime::BatchItem item{&cache, stream.data(), 8, false};
      std::vector<float> step(c.vocab_size);
      ASSERT_TRUE(e.forward->Run({&item, 1}, step.data()).ok()) << name;
      for (size_t t = 8; t < stream.size(); ++t) {
        item = runtime::BatchItem{&cache, &stream[t], 1};
        const absl::Status st = e.forward->Run({&item, 1}, step.data());
        ASSERT_TRUE(st.ok()) << name << " step " << t << ": " << st;
        logits[key].insert(logits[key].end(), step.begin(), step.end());
      }
    }
    EXPECT_LT(kernels::RelErr(logits[1], logits[0]), 1e-3) << name;

    cache::eviction::SessionEvictorOptions o;
    o.policy.name = "lazy";
    o.policy.window = 16;
    o.policy.alpha = 1e-3f;
    o.budget.budget = 48;
    std::map<int, std::vector<int32_t>> tokens;
    std::map<int, KeepSets> keep;
    for (kernels::Backend* b : {cpu_.get(), gpu_.get()}) {
      const int key = b == gpu_.get();
      Engine& e = key ? gpu_engine_ : cpu_engine_;
      auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16, dtype},
                                           4 * c.n_layers * ((c.max_seq_len + 15) / 16),
                                           b->memory());
      ASSERT_TRUE(pool.ok()) << pool.status();
      auto seq = LocalSequence::Create(*e.forward, **pool, o);
      ASSERT_TRUE(seq.ok()) << seq.status();
      GenerateOptions g;
      g.sampling.temperature = 0.0f;
      g.max_tokens = 160;
      auto result = Generate(**seq, *b, c, *tok_,
                             tok_->Encode("Once upon a time, there was a little girl", true), g);
      ASSERT_TRUE(result.ok()) << name << ": " << result.status();
      EXPECT_GT(result->evictions, 0) << name;
      tokens[key] = result->tokens;
      const cache::SequenceCache& sc = (*seq)->cache();
      for (int l = 0; l < c.n_layers; ++l) {
        for (int h = 0; h < c.n_kv_heads; ++h) {
          for (int s = 0; s < sc.length(l, h); ++s) keep[key][{l, h}].push_back(sc.position(l, h, s));
        }
      }
    }
    EXPECT_EQ(tokens[1], tokens[0]) << name;
    EXPECT_EQ(keep[1], keep[0]) << name;
  }
}

TEST_F(CudaEngineTest, EvictionKeepsTheCpuKeepSets) {
  for (const char* policy : {"lazy", "h2o", "lazy+"}) {
    cache::eviction::SessionEvictorOptions o;
    o.policy.name = policy;
    o.policy.window = 16;
    o.policy.alpha = 1e-3f;
    o.budget.budget = 48;
    std::map<int, std::vector<int32_t>> tokens;
    std::map<int, KeepSets> keep;
    std::map<int, int64_t> evictions;
    for (Engine* e : {&cpu_engine_, &gpu_engine_}) {
      const int key = e == &gpu_engine_;
      auto seq = LocalSequence::Create(*e->forward, *e->pool, o);
      ASSERT_TRUE(seq.ok()) << seq.status();
      GenerateOptions g;
      g.sampling.temperature = 0.0f;
      g.max_tokens = 220;
      kernels::Backend& sampler = e == &gpu_engine_ ? *gpu_ : *cpu_;
      auto result = Generate(**seq, sampler, model_->config, *tok_,
                             tok_->Encode("Once upon a time, there was a little girl", true), g);
      ASSERT_TRUE(result.ok()) << result.status();
      tokens[key] = result->tokens;
      evictions[key] = result->evictions;
      const cache::SequenceCache& cache = (*seq)->cache();
      for (int l = 0; l < model_->config.n_layers; ++l) {
        for (int h = 0; h < model_->config.n_kv_heads; ++h) {
          for (int s = 0; s < cache.length(l, h); ++s) {
            keep[key][{l, h}].push_back(cache.position(l, h, s));
          }
        }
      }
    }
    EXPECT_GT(evictions[0], 0) << policy << ": the run must evict";
    EXPECT_EQ(evictions[1], evictions[0]) << policy;
    EXPECT_EQ(tokens[1], tokens[0]) << policy;
    EXPECT_EQ(keep[1], keep[0]) << policy;
  }
}

// Policies that read cached K/V rows on the host are refused with a clear error on a GPU cache
// (not a crash reading device memory); the ones that only need probabilities are accepted.
// Int8 weights on the GPU (weight-only widening) against the CPU's int8 (activations
// quantized too) and f32: teacher-forced over 200 tokens of the golden text, mean KL of each
// against f32 below 0.01 and the GPU's below the CPU's (it quantizes less).
// The next-token logits after each of `tokens`, fed one at a time to `m` on `backend`.
std::vector<std::vector<float>> TeacherForced(kernels::Backend& backend, const model::Model& m,
                                              const std::vector<int32_t>& tokens) {
  const model::ModelConfig& c = m.config;
  auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16}, c.n_layers * 16,
                                       backend.memory());
  EXPECT_TRUE(pool.ok()) << pool.status();
  runtime::ForwardPass forward(m, backend, runtime::ForwardOptions{16});
  cache::SequenceCache seq(pool->get());
  std::vector<std::vector<float>> out;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  for (const int32_t t : tokens) {
    runtime::BatchItem item{&seq, &t, 1};
    EXPECT_TRUE(forward.Run({&item, 1}, logits.data()).ok());
    out.push_back(logits);
  }
  return out;
}

TEST_F(CudaEngineTest, Int8WeightsStayCloseToF32) {
  std::vector<int32_t> tokens =
      tok_->Encode(Golden("models/stories260K/golden_greedy_once_upon_a_time_n256.txt"), true);
  tokens.resize(200);
  auto run = [&](kernels::Backend& backend, const model::Model& m) {
    return TeacherForced(backend, m, tokens);
  };
  const auto f32 = run(*cpu_, *model_);
  auto int8 = model::LoadLlama2c(testing::SharedPath(kModel));
  ASSERT_TRUE(int8.ok());
  ASSERT_TRUE(model::QuantizeWeightsInt8(**int8).ok());
  const auto on_cpu = run(*cpu_, **int8);
  auto uploaded = model::UploadModel(**int8, gpu_->memory());
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  const auto on_gpu = run(*gpu_, **uploaded);
  auto kl = [&](const std::vector<std::vector<float>>& q) {
    return testing::CompareLogits(f32, q).mean_kl;
  };
  const double cpu_kl = kl(on_cpu), gpu_kl = kl(on_gpu);
  std::printf("int8 weights against f32, 200 golden tokens: CPU KL %.5f, GPU KL %.5f\n", cpu_kl,
              gpu_kl);
  EXPECT_LT(gpu_kl, 0.01);
  EXPECT_LT(gpu_kl, cpu_kl);
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
}

// FP8 weights kept on the GPU (weight_dtype fp8, issue 31), stories260K written as an FP8
// checkpoint by tools/convert_llama2c_to_hf.py, against the same E4M3 values widened to f32
// (code value * scale) on the CPU: teacher-forced over 200 golden tokens, every logit within
// 1e-3 (only the order of the sums differs) and the same argmax at every position.
TEST_F(CudaEngineTest, Fp8WeightsOnTheGpuAreTheirWidenedValues) {
  const std::string dir = testing::MakeTempDir("cuda_fp8");
  const std::string cmd = absl::StrCat(
      "python3 ", testing::SourcePath("tools/convert_llama2c_to_hf.py"), " ",
      testing::SharedPath(kModel), " ", dir, " --dtype fp8 --fp8-block 32 > /dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto kept = model::LoadModel(dir, /*keep_fp8=*/true);
  auto wide = model::LoadModel(dir, /*keep_fp8=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(wide.ok()) << wide.status();
  ASSERT_EQ((*kept)->config.weight_dtype, kernels::DType::kF8E4M3);
  for (model::LayerWeights& l : (*wide)->layers) {
    for (kernels::Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      auto f32 = model::HeapStorage::Create(static_cast<size_t>(w->numel()) * sizeof(float));
      ASSERT_TRUE(f32.ok());
      auto* dst = static_cast<float*>((*f32)->MutableData());
      const auto* q = static_cast<const uint8_t*>(w->data);
      for (int64_t r = 0; r < w->rows; ++r) {
        for (int64_t c = 0; c < w->cols; ++c) {
          dst[r * w->cols + c] = kernels::E4M3ToF32(q[r * w->cols + c]) *
                                 w->scales[r * w->ScaleColumns() + c / w->scale_block];
        }
      }
      *w = kernels::Matrix{(*f32)->data(), kernels::DType::kF32, w->rows, w->cols};
      (*wide)->storage.push_back(std::move(*f32));
    }
  }
  std::vector<int32_t> tokens =
      tok_->Encode(Golden("models/stories260K/golden_greedy_once_upon_a_time_n256.txt"), true);
  tokens.resize(200);
  auto uploaded = model::UploadModel(**kept, gpu_->memory());
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  const auto on_gpu = TeacherForced(*gpu_, **uploaded, tokens);
  const auto on_cpu = TeacherForced(*cpu_, **wide, tokens);
  double worst = 0;
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    for (size_t v = 0; v < on_cpu[i].size(); ++v) {
      worst = std::max(worst, static_cast<double>(std::fabs(on_gpu[i][v] - on_cpu[i][v])));
    }
  }
  const testing::LogitsAgreement agree = testing::CompareLogits(on_cpu, on_gpu);
  std::printf(
      "fp8 weights, GPU kept against CPU widened, 200 golden tokens: largest logit "
      "difference %.2e, top-1 %.3f, KL %.2e\n",
      worst, agree.top1, agree.mean_kl);
  EXPECT_LT(worst, 1e-3);
  EXPECT_EQ(agree.top1, 1.0);
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
  std::filesystem::remove_all(dir);
}

TEST_F(CudaEngineTest, HostRowReadingPoliciesAreRefusedOnTheGpu) {
  for (const char* name : {"snapkv", "rkv", "vase"}) {
    cache::eviction::SessionEvictorOptions o;
    o.policy.name = name;
    o.budget.budget = 48;
    auto seq = LocalSequence::Create(*gpu_engine_.forward, *gpu_engine_.pool, o);
    ASSERT_FALSE(seq.ok()) << name;
    EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument) << seq.status();
    EXPECT_NE(seq.status().message().find("GPU"), std::string::npos) << seq.status();
    EXPECT_TRUE(LocalSequence::Create(*cpu_engine_.forward, *cpu_engine_.pool, o).ok()) << name;
  }
  for (const char* name : {"lazy", "lazy+", "h2o", "tova", "streaming"}) {
    cache::eviction::SessionEvictorOptions o;
    o.policy.name = name;
    o.budget.budget = 48;
    EXPECT_TRUE(LocalSequence::Create(*gpu_engine_.forward, *gpu_engine_.pool, o).ok()) << name;
  }
}

}  // namespace
}  // namespace recall::offline
