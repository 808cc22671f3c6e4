// BlockwisePrefill on a small random model: a history ten times the budget is read with the
// cache never above budget + one block and ends at exactly the budget, without any patch
// slot; the kept slots are those PatchScores ranks highest for the patch's queries; a short
// history is a plain prefill; per-layer and head-adaptive budgets hold; bad arguments are
// refused by name.
#include "worker/runtime/episodic/block_prefill.h"

#include <cmath>
#include <numeric>

#include "cache/episodic/patch_scores.h"
#include "gtest/gtest.h"
#include "tests/common/tiny_model.h"
#include "worker/model/random_model.h"

namespace recall::runtime::episodic {
namespace {

constexpr int kBlockTokens = 16;  // slots per pool block

class BlockPrefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::ModelConfig c = testing::TinyModelConfig(3, 2048);
    c.hidden_dim = 128;
    c.vocab_size = 96;
    c.tied_embeddings = false;
    auto m = model::MakeRandomModel(c, kernels::DType::kF32, 7);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    backend_ = kernels::CreateCpuBackend({1});
    layout_ = {c.n_layers, c.n_kv_heads, c.head_dim, kBlockTokens};
    auto pool = cache::BlockPool::Create(layout_, c.n_layers * (c.max_seq_len / kBlockTokens));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    forward_ = std::make_unique<ForwardPass>(*model_, *backend_, ForwardOptions{64});
  }

  static std::vector<int32_t> Tokens(int n, int seed) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[i] = 3 + (i * 37 + seed * 11 + (i * i) % 13) % 90;
    return t;
  }

  absl::Status Plain(cache::SequenceCache* cache, std::span<const int32_t> tokens,
                     float* queries = nullptr, int w = 0, int first = 0) {
    for (size_t s = 0; s < tokens.size(); s += 64) {
      BatchItem item;
      item.cache = cache;
      item.tokens = tokens.data() + s;
      item.n = static_cast<int>(std::min<size_t>(64, tokens.size() - s));
      item.want_logits = false;
      item.window_queries = queries;
      item.window_w = w;
      item.window_first = first;
      absl::Status st = forward_->Run({&item, 1}, nullptr);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  std::vector<int32_t> Uniform(int budget) const {
    return std::vector<int32_t>(static_cast<size_t>(model_->config.n_layers), budget);
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<kernels::Backend> backend_;
  kernels::PagedKvLayout layout_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
};

TEST_F(BlockPrefillTest, HistoryTenTimesTheBudgetPeaksAtBudgetPlusOneBlock) {
  const int budget = 32, block = 64;
  const std::vector<int32_t> history = Tokens(10 * budget, 1), patch = Tokens(16, 2);
  cache::SequenceCache cache(pool_.get());
  auto stats =
      BlockwisePrefill(*forward_, &cache, history, patch, Uniform(budget), {block, 64, false});
  ASSERT_TRUE(stats.ok()) << stats.status();
  const model::ModelConfig& c = model_->config;
  EXPECT_EQ(stats->blocks, (10 * budget + (block - 16) - 1) / (block - 16));
  EXPECT_LE(stats->max_layer_slots, budget + block);
  const int64_t bound =
      c.n_layers * ((budget + block + kBlockTokens - 1) / kBlockTokens) * pool_->block_bytes();
  EXPECT_LE(stats->peak_bytes, bound);
  EXPECT_EQ(stats->evicted_slots,
            static_cast<int64_t>(10 * budget - budget) * c.n_layers * c.n_kv_heads);
  EXPECT_EQ(cache.next_position(), 10 * budget) << "the patch's positions were given back";
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      ASSERT_EQ(cache.length(l, h), budget);
      for (int s = 0; s < budget; ++s) {
        EXPECT_LT(cache.position(l, h, s), 10 * budget) << "a patch slot stayed";
        if (s > 0) {
          EXPECT_LT(cache.position(l, h, s - 1), cache.position(l, h, s));
        }
      }
    }
  }
  // One-shot prefill of the same history, for scale: the block-wise peak is a fraction.
  cache::SequenceCache full(pool_.get());
  ASSERT_TRUE(Plain(&full, history).ok());
  EXPECT_LT(stats->peak_bytes * 3, full.bytes_held());
  // The compressed cache goes on: the next token lands at the history's end.
  const int32_t next = 5;
  BatchItem item{&cache, &next, 1};
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  ASSERT_TRUE(forward_->Run({&item, 1}, logits.data()).ok());
  EXPECT_EQ(cache.position(0, 0, budget), 10 * budget);
}

// Compact positions (issue 25): a history eight times the context is read with the positions
// re-positioned before they would pass it; original positions stop at the context.
TEST_F(BlockPrefillTest, CompactPositionsReadAHistoryLongerThanTheContext) {
  model::ModelConfig c = model_->config;
  c.max_seq_len = 128;
  auto small = model::MakeRandomModel(c, kernels::DType::kF32, 7);
  ASSERT_TRUE(small.ok()) << small.status();
  ForwardPass forward(**small, *backend_, ForwardOptions{64});
  const int budget = 32, block = 64;
  const std::vector<int32_t> history = Tokens(8 * c.max_seq_len, 5), patch = Tokens(16, 6);
  BlockPrefillOptions o{block, 64, false};
  {
    cache::SequenceCache cache(pool_.get());
    auto stats = BlockwisePrefill(forward, &cache, history, patch, Uniform(budget), o);
    ASSERT_FALSE(stats.ok());
    EXPECT_NE(stats.status().message().find("context"), std::string::npos) << stats.status();
  }
  o.positions = Positions::kCompact;
  cache::SequenceCache cache(pool_.get());
  auto stats = BlockwisePrefill(forward, &cache, history, patch, Uniform(budget), o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->compactions, 4);
  EXPECT_LE(stats->max_layer_slots, budget + block);
  EXPECT_LE(cache.next_position(), c.max_seq_len);
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      ASSERT_EQ(cache.length(l, h), budget);
      for (int s = 1; s < budget; ++s) {
        EXPECT_LT(cache.position(l, h, s - 1), cache.position(l, h, s));
      }
      EXPECT_LT(cache.position(l, h, budget - 1), cache.next_position());
    }
  }
  // It goes on: the next token lands at the next position, within the context.
  const int32_t next = 5;
  BatchItem item{&cache, &next, 1};
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  ASSERT_TRUE(forward.Run({&item, 1}, logits.data()).ok());
  for (const float v : logits) ASSERT_TRUE(std::isfinite(v));
  // A budget and a block that cannot fit the context together: refused when it comes to it.
  cache::SequenceCache tight(pool_.get());
  auto refused = BlockwisePrefill(forward, &tight, history, patch, Uniform(100), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange) << refused.status();
}

TEST_F(BlockPrefillTest, KeepsTheSlotsThePatchQueriesRankHighest) {
  // One block: the history, then the patch; the reference runs the same tokens in a plain
  // cache, captures the patch's queries and ranks the history slots with PatchScores.
  const int budget = 10, n = 40, p = 8;
  const std::vector<int32_t> history = Tokens(n, 3), patch = Tokens(p, 4);
  cache::SequenceCache cache(pool_.get());
  ASSERT_TRUE(
      BlockwisePrefill(*forward_, &cache, history, patch, Uniform(budget), {64, 64, false}).ok());
  const model::ModelConfig& c = model_->config;
  cache::SequenceCache ref(pool_.get());
  std::vector<float> queries(static_cast<size_t>(c.n_layers) * p * c.n_heads * c.head_dim);
  std::vector<int32_t> all = history;
  all.insert(all.end(), patch.begin(), patch.end());
  ASSERT_TRUE(Plain(&ref, all, queries.data(), p, n).ok());
  const int group = c.n_heads / c.n_kv_heads;
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      std::vector<float> keys;
      for (int j = 0; j < n + p; ++j) {
        const float* k = ref.View().K(l, h, j);
        keys.insert(keys.end(), k, k + c.head_dim);
      }
      std::vector<double> scratch;
      std::vector<float> score(n);
      cache::episodic::PatchScores(
          keys.data(), n, queries.data() + static_cast<size_t>(l) * p * c.n_heads * c.head_dim, p,
          c.n_heads, h * group, group, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
          &scratch, score.data());
      std::vector<int32_t> order, want;
      cache::episodic::KeepTop(score.data(), n, budget, &order, &want);
      std::vector<int32_t> got;
      for (int s = 0; s < cache.length(l, h); ++s) got.push_back(cache.position(l, h, s));
      EXPECT_EQ(got, want) << "layer " << l << " head " << h;
    }
  }
}

TEST_F(BlockPrefillTest, AHistoryWithinTheBudgetIsAPlainPrefill) {
  const std::vector<int32_t> history = Tokens(20, 5), patch = Tokens(8, 6);
  cache::SequenceCache cache(pool_.get()), plain(pool_.get());
  auto stats = BlockwisePrefill(*forward_, &cache, history, patch, Uniform(32), {16, 64, false});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks, 3);
  EXPECT_EQ(stats->scored_blocks, 0);
  ASSERT_TRUE(Plain(&plain, history).ok());
  const model::ModelConfig& c = model_->config;
  for (int l = 0; l < c.n_layers; ++l) {
    for (int s = 0; s < 20; ++s) {
      for (int d = 0; d < c.head_dim; ++d) {
        ASSERT_FLOAT_EQ(cache.View().K(l, 1, s)[d], plain.View().K(l, 1, s)[d]);
      }
    }
  }
}

TEST_F(BlockPrefillTest, PerLayerAndHeadAdaptiveBudgetsHold) {
  const std::vector<int32_t> history = Tokens(200, 7), patch = Tokens(12, 8);
  const std::vector<int32_t> budgets = {40, 24, 8};
  cache::SequenceCache per_layer(pool_.get());
  ASSERT_TRUE(
      BlockwisePrefill(*forward_, &per_layer, history, patch, budgets, {48, 48, false}).ok());
  cache::SequenceCache adaptive(pool_.get());
  ASSERT_TRUE(BlockwisePrefill(*forward_, &adaptive, history, patch, budgets, {48, 48, true}).ok());
  bool uneven = false;
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(per_layer.length(l, 0), budgets[l]);
    EXPECT_EQ(per_layer.length(l, 1), budgets[l]);
    EXPECT_EQ(adaptive.length(l, 0) + adaptive.length(l, 1), 2 * budgets[l]);
    uneven |= adaptive.length(l, 0) != adaptive.length(l, 1);
  }
  EXPECT_TRUE(uneven) << "head-adaptive budgets let heads keep different counts";
}

TEST_F(BlockPrefillTest, BadArgumentsAreRefusedByName) {
  cache::SequenceCache cache(pool_.get());
  const std::vector<int32_t> history = Tokens(30, 9), patch = Tokens(8, 1);
  const auto run = [&](std::span<const int32_t> p, std::vector<int32_t> budgets,
                       BlockPrefillOptions o) {
    return BlockwisePrefill(*forward_, &cache, history, p, budgets, o).status();
  };
  EXPECT_EQ(run({}, Uniform(8), {}).message(), "patch: needs at least one token");
  EXPECT_EQ(run(patch, Uniform(8), {8, 64, false}).message(),
            "block_tokens: 8 must exceed the patch's 8 tokens");
  EXPECT_EQ(run(patch, {8, 8}, {32, 64, false}).message(),
            "budgets: expected 3 (one per layer), got 2");
  EXPECT_EQ(run(patch, {8, 0, 8}, {32, 64, false}).message(), "budgets[1]: 0 must be >= 1");
  EXPECT_EQ(run(patch, Uniform(8), {32, 65, false}).message(), "chunk: 65 not in [1, 64]");
  EXPECT_EQ(cache.next_position(), 0) << "nothing was run";
}

}  // namespace
}  // namespace recall::runtime::episodic
