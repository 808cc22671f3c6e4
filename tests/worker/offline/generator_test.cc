// Generate(): finish conditions, stop strings, streaming and option validation, on a
// random-weight model with a small fake tokenizer (one letter per id).
#include "worker/offline/generator.h"

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "worker/model/random_model.h"

namespace recall::offline {
namespace {

class LetterTokenizer : public model::Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool = true) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(0);
    for (char ch : text) ids.push_back(1 + (ch - 'a') % 26);
    return ids;
  }
  std::string Decode(const std::vector<int32_t>& ids, bool = false) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += TokenBytes(i ? ids[i - 1] : -1, ids[i]);
    return s;
  }
  std::string TokenBytes(int32_t, int32_t id) const override {
    return id == 0 ? "" : std::string(1, static_cast<char>('a' + (id - 1) % 26));
  }
  int vocab_size() const override { return 97; }
  int32_t bos_id() const override { return 0; }
  int32_t eos_id() const override { return -1; }
  std::optional<int32_t> PieceToId(std::string_view) const override { return std::nullopt; }
};

class GeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::ModelConfig c;
    c.dim = 32;
    c.hidden_dim = 48;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 16;
    c.vocab_size = 97;
    c.max_seq_len = 64;
    c.tied_embeddings = true;
    auto m = model::MakeRandomModel(c, kernels::DType::kF32, 3);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    backend_ = kernels::CreateCpuBackend({1});
    pool_ = std::move(*cache::BlockPool::Create({2, 1, 16, 8}, 2 * 16));  // 16 per layer
    forward_ =
        std::make_unique<runtime::ForwardPass>(*model_, *backend_, runtime::ForwardOptions{64});
  }
  absl::StatusOr<GenerateResult> Run(const GenerateOptions& o, std::string* streamed = nullptr) {
    return Generate(*forward_, *pool_, tok_, tok_.Encode("hello", true), o,
                    [streamed](const std::string& d) {
                      if (streamed) *streamed += d;
                    });
  }

  LetterTokenizer tok_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<runtime::ForwardPass> forward_;
};

TEST_F(GeneratorTest, StopsAtMaxTokensAndStreamsTheWholeText) {
  GenerateOptions o;
  o.max_tokens = 10;
  o.sampling.temperature = 0;
  std::string streamed;
  auto r = Run(o, &streamed);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 10u);
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
  EXPECT_EQ(streamed, r->text);
  EXPECT_EQ(r->prompt_tokens, 6);
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks());
}

TEST_F(GeneratorTest, StopStringEndsTheTextBeforeIt) {
  GenerateOptions o;
  o.max_tokens = 20;
  o.sampling.temperature = 0;
  auto full = Run(o);
  ASSERT_TRUE(full.ok());
  ASSERT_GE(full->text.size(), 8u);
  // Stop at the 3 letters that start at offset 5 of the free-running text.
  o.stop_strings = {full->text.substr(5, 3)};
  std::string streamed;
  auto r = Run(o, &streamed);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStopString);
  const size_t first = full->text.find(o.stop_strings[0]);
  EXPECT_EQ(r->text, full->text.substr(0, first));
  EXPECT_EQ(streamed, r->text) << "no part of the stop string may be streamed";
}

TEST_F(GeneratorTest, StopTokenEndsGenerationAndIsNotOutput) {
  GenerateOptions o;
  o.max_tokens = 20;
  o.sampling.temperature = 0;
  auto full = Run(o);
  ASSERT_TRUE(full.ok());
  o.stop_token_ids = {full->tokens[3]};
  auto r = Run(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kStopToken);
  const auto first = std::find(full->tokens.begin(), full->tokens.end(), full->tokens[3]);
  EXPECT_EQ(r->tokens, std::vector<int32_t>(full->tokens.begin(), first));
}

TEST_F(GeneratorTest, ContextLimitEndsGeneration) {
  GenerateOptions o;
  o.max_tokens = 1000;
  o.sampling.temperature = 0;
  auto r = Run(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, FinishReason::kContext);
  EXPECT_EQ(r->prompt_tokens + static_cast<int>(r->tokens.size()), 64 + 1);
}

TEST_F(GeneratorTest, SameSeedSameTextDifferentSeedDiffers) {
  GenerateOptions o;
  o.max_tokens = 30;
  o.sampling.temperature = 1.5f;
  o.sampling.seed = 11;
  auto a = Run(o), b = Run(o);
  o.sampling.seed = 12;
  auto c = Run(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
}

TEST_F(GeneratorTest, BadOptionsNameTheField) {
  GenerateOptions o;
  o.max_tokens = 0;
  EXPECT_NE(Run(o).status().message().find("max_tokens"), std::string::npos);
  o.max_tokens = 5;
  o.sampling.top_p = 0;
  EXPECT_NE(Run(o).status().message().find("top_p"), std::string::npos);
  o.sampling.top_p = 1;
  o.sampling.temperature = -1;
  EXPECT_NE(Run(o).status().message().find("temperature"), std::string::npos);
  o.sampling.temperature = 1;
  o.stop_strings = {""};
  EXPECT_EQ(Run(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recall::offline

namespace recall::offline {
namespace {

TEST_F(GeneratorTest, EvictionKeepsTheCacheWithinBudgetAndIsDeterministic) {
  // Prompt 6 + 50 generated = 56 tokens through a lazy cache of C = 16, W = 8: the cache
  // peaks at C + W and ends at C (+ the tokens appended since the last eviction).
  GenerateOptions o;
  o.max_tokens = 50;
  o.sampling.temperature = 0;
  cache::eviction::SessionEvictorOptions eo;
  eo.policy.name = "lazy";
  eo.policy.window = 8;
  eo.budget.budget = 16;
  o.eviction = eo;
  auto a = Run(o), b = Run(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->tokens, b->tokens) << "eviction must be deterministic";
  EXPECT_GT(a->evictions, 0);
  // 8 tokens of both layers; the pool's blocks hold 8 tokens of one layer.
  const int64_t block_bytes = 2 * pool_->block_bytes();
  // lazy's state: ts and mri of each layer's KV head, at most 24 slots (and their slack).
  const int64_t state = 2 * cache::eviction::HeadStateBytesBound(
                                cache::eviction::kTsArray | cache::eviction::kMriArray, 24);
  EXPECT_LE(a->peak_kv_bytes, 4 * block_bytes + state)
      << "C + W = 24 slots, plus one partial block, and lazy's state";
  EXPECT_LE(a->final_kv_bytes, 3 * block_bytes + state);
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks());

  o.eviction.reset();
  auto full = Run(o);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->evictions, 0);
  EXPECT_EQ(full->final_kv_bytes, 7 * block_bytes) << "56 slots in blocks of 8";
}

TEST_F(GeneratorTest, BadEvictionOptionsAreRejected) {
  GenerateOptions o;
  cache::eviction::SessionEvictorOptions eo;
  eo.policy.name = "lru";
  o.eviction = eo;
  const absl::Status st = Run(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lazy"), std::string::npos) << st.message();
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks()) << "the prompt's blocks go back";
}

}  // namespace
}  // namespace recall::offline

namespace recall::offline {
namespace {

// Greedy generation with SnapKV keeping C = 16 of the prompt (W = 4 window queries).
GenerateOptions SnapKv(int max_tokens, runtime::Positions positions) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0;
  o.positions = positions;
  cache::eviction::SessionEvictorOptions eo;
  eo.policy.name = "snapkv";
  eo.policy.window = 4;
  eo.budget.budget = 16;
  o.eviction = eo;
  return o;
}

TEST_F(GeneratorTest, SnapKvCompressesThePromptOnceThenGrows) {
  // A 41-token prompt compressed to C = 16 right after prefill (W = 4 window queries), then
  // 10 generated tokens (9 of them forwarded): 25 slots, i.e. 4 blocks of 8.
  const std::vector<int32_t> prompt = tok_.Encode("abcdefghijklmnopqrstuvwxyzabcdefghijklmn", true);
  ASSERT_EQ(prompt.size(), 41u);
  const GenerateOptions o = SnapKv(10, runtime::Positions::kOriginal);
  auto r = Generate(*forward_, *pool_, tok_, prompt, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens.size(), 10u);
  // Both layers hold the same number of blocks (uniform budget).
  EXPECT_EQ(r->peak_kv_bytes, 2 * 6 * pool_->block_bytes())
      << "the whole prompt before compression";
  EXPECT_EQ(r->final_kv_bytes, 2 * 4 * pool_->block_bytes());
  auto again = Generate(*forward_, *pool_, tok_, prompt, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tokens, r->tokens);
}

// With compact positions SnapKV goes past the context as far as its cache, compressed once,
// leaves room: the reply ends (finish context) when the cache holds the context, as a
// served session's does. (It failed there: "position 64 exceeds the model's context length".)
// Its prompt is not compressed until it is all in, so a prompt must fit the context.
TEST_F(GeneratorTest, CompactSnapKvEndsWhenItsCacheHoldsTheContext) {
  const std::vector<int32_t> prompt = tok_.Encode("abcdefghijklmnopqrstuvwxyzabcdefghijklmn", true);
  const GenerateOptions o = SnapKv(1000, runtime::Positions::kCompact);
  auto r = Generate(*forward_, *pool_, tok_, prompt, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->finish_reason, FinishReason::kContext);
  // 16 kept of the prompt, then one slot per token: the last token is not forwarded.
  EXPECT_EQ(r->tokens.size(), 64u - 16u + 1u);
  EXPECT_GT(r->prompt_tokens + static_cast<int>(r->tokens.size()), 64);
  EXPECT_EQ(r->final_kv_bytes, 2 * 8 * pool_->block_bytes());

  const std::vector<int32_t> long_prompt(64, 3);
  auto refused = Generate(*forward_, *pool_, tok_, long_prompt, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "prompt: 64 tokens leave no room in the context of 64 tokens");
}

}  // namespace
}  // namespace recall::offline
