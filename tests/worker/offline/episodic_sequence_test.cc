// EpisodicSequence and SplitSentences on stories260K: a conversation of four stories is
// clustered into episodes, every episode's cache is compressed to the budget (together
// within E budgets, the device never above budget + one block while building), the first
// sentence of a story is routed to that story's episode, decoding keeps the lazy budget; a
// prompt within the budget is a plain lazy run; bad options are refused by name.
#include "worker/offline/episodic_sequence.h"

#include "gtest/gtest.h"
#include "tests/common/stories260k.h"
#include "worker/model/loader.h"
#include "worker/offline/sentences.h"
#include "worker/runtime/episodic/block_prefill.h"
#include "worker/runtime/episodic/episode_set.h"

namespace recall::offline {
namespace {

// Four stories of four sentences each: with windows of four sentences and no recent context,
// every window is one story.
constexpr char kStories[] =
    "Lily had a red ball. She played with the ball in the park. The ball went into the pond. "
    "A duck gave Lily the ball back. "
    "Tom saw a big blue truck. The truck was very loud. Tom waved at the driver of the truck. "
    "The driver honked and Tom laughed. "
    "Sue baked a cake with her dad. They put sugar and eggs in the cake. The cake was warm and "
    "sweet. Sue gave some cake to her cat. "
    "Ben found a bird in the garden. The bird had a hurt wing. Ben made a bed for the bird. "
    "Soon the bird could fly again. ";

class EpisodicSequenceTest : public recall::testing::Stories260KTest {
 protected:
  void SetUp() override {
    Stories260KTest::SetUp();
    if (model_ == nullptr) return;  // skipped or failed
    backend_ = kernels::CreateCpuBackend({1});
    const model::ModelConfig& c = model_->config;
    layout_ = {c.n_layers, c.n_kv_heads, c.head_dim, 16};
    auto pool = cache::BlockPool::Create(layout_, c.n_layers * (c.max_seq_len / 16) * 2);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    forward_ =
        std::make_unique<runtime::ForwardPass>(*model_, *backend_, runtime::ForwardOptions{256});
  }

  EpisodicOptions Options(const std::string& embedder) const {
    EpisodicOptions o;
    o.embedder = embedder;
    o.recent_utterances = 0;
    o.block.block_tokens = 96;
    o.decode.policy.name = "lazy";
    o.decode.policy.window = 16;
    o.decode.budget.budget = kBudget;
    return o;
  }

  std::unique_ptr<EpisodicSequence> Make(const EpisodicOptions& o) {
    auto seq = EpisodicSequence::Create(*forward_, *pool_, *tok_, o);
    EXPECT_TRUE(seq.ok()) << seq.status();
    return seq.ok() ? std::move(*seq) : nullptr;
  }

  static constexpr int kBudget = 24;
  std::unique_ptr<kernels::Backend> backend_;
  kernels::PagedKvLayout layout_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<runtime::ForwardPass> forward_;
};

TEST_F(EpisodicSequenceTest, SentencesAreSplitAfterTheirPunctuationWithClosingQuotes) {
  const std::vector<int32_t> ids = tok_->Encode("Lily ran. \"Hi!\" said Tom. The end", true);
  const std::vector<TokenSpan> spans = SplitSentences(ids, *tok_);
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[0].begin, 1) << "the BOS belongs to no sentence";
  std::vector<std::string> texts;
  for (const TokenSpan& s : spans) {
    texts.push_back(tok_->Decode(std::vector<int32_t>(ids.begin() + s.begin, ids.begin() + s.end)));
  }
  EXPECT_EQ(texts[0], " Lily ran.") << "SentencePiece's dummy prefix space";
  EXPECT_EQ(texts[1], " \"Hi!\"");
  EXPECT_EQ(texts[2], " said Tom.");
  EXPECT_EQ(texts[3], " The end");
  EXPECT_EQ(spans.back().end, static_cast<int>(ids.size()));
}

TEST_F(EpisodicSequenceTest, EachStoryIsAnEpisodeAndTheQueryIsAnsweredFromItsStory) {
  const std::string query = "Sue baked a cake with her dad.";
  const std::vector<int32_t> prompt = tok_->Encode(std::string(kStories) + query, true);
  auto seq = Make(Options("tfidf"));
  ASSERT_NE(seq, nullptr);
  std::vector<float> logits(static_cast<size_t>(model_->config.vocab_size));
  ASSERT_TRUE(seq->Prefill(prompt, 64, logits.data()).ok());
  const EpisodicStats& s = seq->episodic_stats();
  ASSERT_EQ(s.episodes.size(), 4u);
  ASSERT_GE(s.active, 0);
  EXPECT_FALSE(s.routed_by_fallback);
  // Every story is an episode; the query went to Sue's (window 2).
  for (const EpisodeInfo& e : s.episodes) EXPECT_EQ(e.windows.size(), 1u);
  EXPECT_EQ(s.episodes[s.active].windows, std::vector<int>{2});
  const model::ModelConfig& c = model_->config;
  for (size_t e = 0; e < seq->caches().size(); ++e) {
    const cache::SequenceCache& cache = *seq->caches()[e];
    EXPECT_EQ(cache.offloaded(), static_cast<int>(e) != s.active);
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const int limit = kBudget + (static_cast<int>(e) == s.active ? s.recent_tokens : 0);
        EXPECT_LE(cache.length(l, h), limit) << "episode " << e << " layer " << l;
      }
    }
  }
  const int64_t block_bound = c.n_layers * ((kBudget + 96 + 15) / 16) * pool_->block_bytes();
  EXPECT_LE(s.build_peak_bytes, block_bound) << "the device held budget + one block at most";
  EXPECT_EQ(s.history_tokens + s.recent_tokens, static_cast<int>(prompt.size()));
  EXPECT_EQ(seq->next_position(), static_cast<int>(prompt.size()));
  // Decoding keeps lazy's budget: at most C + W slots after W steps.
  for (int i = 0; i < 40; ++i) {
    int32_t next = 0;
    for (int v = 1; v < c.vocab_size; ++v) {
      if (logits[v] > logits[next]) next = v;
    }
    ASSERT_TRUE(seq->Decode(next, logits.data()).ok());
  }
  EXPECT_LE(seq->cache().max_length(), kBudget + 16);
  EXPECT_GT(seq->stats().evictions, 0);
}

TEST_F(EpisodicSequenceTest, RoutingFollowsTheStoryWhateverItsPlace) {
  // The last: a question and then "A:", a sentence too short to route by on its own.
  const char* queries[] = {"Lily had a red ball.", "Tom saw a big blue truck.",
                           "Ben found a bird in the garden.", "Q: What did Sue give her cat?\nA:"};
  const int stories[] = {0, 1, 3, 2};
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> prompt = tok_->Encode(std::string(kStories) + queries[i], true);
    auto seq = Make(Options("tfidf"));
    ASSERT_NE(seq, nullptr);
    std::vector<float> logits(static_cast<size_t>(model_->config.vocab_size));
    ASSERT_TRUE(seq->Prefill(prompt, 64, logits.data()).ok());
    const EpisodicStats& s = seq->episodic_stats();
    ASSERT_GE(s.active, 0);
    EXPECT_EQ(s.episodes[s.active].windows, std::vector<int>{stories[i]}) << queries[i];
  }
}

TEST_F(EpisodicSequenceTest, TheModelEmbedderClustersAndRoutesToo) {
  const std::vector<int32_t> prompt =
      tok_->Encode(std::string(kStories) + "Tom saw a big blue truck.", true);
  auto seq = Make(Options("model"));
  ASSERT_NE(seq, nullptr);
  std::vector<float> logits(static_cast<size_t>(model_->config.vocab_size));
  ASSERT_TRUE(seq->Prefill(prompt, 64, logits.data()).ok());
  EXPECT_GE(seq->episodic_stats().active, 0);
  EXPECT_GE(seq->episodic_stats().episodes.size(), 2u);
}

TEST_F(EpisodicSequenceTest, APromptWithinTheBudgetIsAPlainLazyRun) {
  const std::vector<int32_t> prompt = tok_->Encode("Lily had a red ball. She was happy.", true);
  EpisodicOptions o = Options("tfidf");
  o.decode.budget.budget = 64;
  auto seq = Make(o);
  ASSERT_NE(seq, nullptr);
  std::vector<float> a(static_cast<size_t>(model_->config.vocab_size)), b(a.size());
  ASSERT_TRUE(seq->Prefill(prompt, 64, a.data()).ok());
  EXPECT_EQ(seq->episodic_stats().active, -1);
  auto plain = LocalSequence::Create(*forward_, *pool_, o.decode);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Prefill(prompt, 64, b.data()).ok());
  EXPECT_EQ(a, b);
}

TEST_F(EpisodicSequenceTest, APatchCopyingAStoryKeepsMoreOfThatStory) {
  // History: Lily's story, then Tom's. Compressed to a small budget with a patch that
  // copies one story, each cache should keep more of the copied story than the other does.
  // On this tiny model the effect is small (Lily keeps 17.1% of the slots when her story
  // judges, 15.8% when Tom's does): the patch queries attend mostly by recency, which is why
  // the episodes of the quality benchmark hardly differ.
  const std::string lily =
      "Lily had a red ball. She played with the ball in the park. "
      "The ball went into the pond. A duck gave Lily the ball back. ";
  const std::string tom =
      "Tom saw a big blue truck. The truck was very loud. Tom waved at "
      "the driver of the truck. The driver honked and Tom laughed. ";
  const std::vector<int32_t> history = tok_->Encode(lily + tom, true);
  const int lily_end = static_cast<int>(tok_->Encode(lily, true).size());
  const model::ModelConfig& c = model_->config;
  const std::vector<int32_t> budgets(static_cast<size_t>(c.n_layers), 16);
  const auto kept_share = [&](const std::string& patch_text) {
    cache::SequenceCache cache(pool_.get());
    const std::vector<int32_t> patch = tok_->Encode(patch_text, false);
    EXPECT_TRUE(runtime::episodic::BlockwisePrefill(*forward_, &cache, history, patch, budgets,
                                                    {256, 256, false})
                    .ok());
    int in_lily = 0, total = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int s = 0; s < cache.length(l, h); ++s) {
          const int32_t p = cache.position(l, h, s);
          if (p == 0) continue;  // BOS
          in_lily += p < lily_end ? 1 : 0;
          ++total;
        }
      }
    }
    return static_cast<double>(in_lily) / total;
  };
  const double with_lily = kept_share(lily);
  const double with_tom = kept_share(tom);
  EXPECT_GT(with_lily, with_tom) << "Lily's share: " << with_lily << " judged by her story, "
                                 << with_tom << " judged by Tom's";
}

TEST_F(EpisodicSequenceTest, APatchKeepsItsInstructionAndFitsHalfABlock) {
  const std::vector<int32_t> history = tok_->Encode(kStories, true);
  std::vector<cache::episodic::Window> windows;
  for (const char* w : {"Lily had a red ball. She played with the ball in the park. The ball "
                        "went into the pond. A duck gave Lily the ball back.",
                        "Tom saw a big blue truck. The truck was very loud. Tom waved at the "
                        "driver of the truck. The driver honked and Tom laughed."}) {
    windows.push_back({static_cast<int>(windows.size()), 1, w});
  }
  auto embedder = cache::episodic::HashedTfIdfEmbedder::Create({});
  ASSERT_TRUE(embedder.ok());
  const std::vector<int32_t> instruction =
      tok_->Encode(runtime::episodic::kDefaultInstruction, false);
  const std::vector<int32_t> budgets(static_cast<size_t>(model_->config.n_layers), 16);
  // tok512 spells the instruction in 44 tokens: blocks of 192 keep it (patches of 96 at
  // most), blocks of 64 (patches of 32) leave no room for it beside the text.
  for (const int block : {192, 64}) {
    runtime::episodic::EpisodeBuildOptions o;
    o.episodes = 2;
    o.block.block_tokens = block;
    o.block.chunk = 64;
    auto set = runtime::episodic::BuildEpisodeSet(*forward_, *pool_, *tok_, **embedder, windows,
                                                  history, budgets, o);
    ASSERT_TRUE(set.ok()) << set.status();
    ASSERT_EQ(set->patches.size(), 2u);
    for (const std::vector<int32_t>& patch : set->patches) {
      EXPECT_LE(patch.size(), static_cast<size_t>(block / 2)) << "at most half a block";
      const bool leads = std::equal(instruction.begin(), instruction.end(), patch.begin());
      EXPECT_EQ(leads, block == 192) << "block " << block;
    }
    for (const auto& cache : set->caches) EXPECT_TRUE(cache->offloaded());
  }
}

TEST_F(EpisodicSequenceTest, ABosInsideThePromptSeparatesSentences) {
  std::vector<int32_t> ids = tok_->Encode("A cat ran. It was fast", true);
  const int first_end = static_cast<int>(tok_->Encode("A cat ran.", true).size());
  const size_t bos_at = ids.size();
  ids.push_back(tok_->bos_id());
  const std::vector<int32_t> more = tok_->Encode("The dog sat.", false);
  ids.insert(ids.end(), more.begin(), more.end());
  const std::vector<TokenSpan> spans = SplitSentences(ids, *tok_);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].end, first_end);
  EXPECT_EQ(spans[1].end, static_cast<int>(bos_at)) << "the BOS ends \" It was fast\"";
  EXPECT_EQ(spans[2].begin, static_cast<int>(bos_at)) << "and begins the next text";
  EXPECT_EQ(spans[2].end, static_cast<int>(ids.size()));
}

TEST_F(EpisodicSequenceTest, BadOptionsAreRefusedByName) {
  const auto error = [&](EpisodicOptions o) {
    return std::string(EpisodicSequence::Create(*forward_, *pool_, *tok_, o).status().message());
  };
  EpisodicOptions o = Options("tfidf");
  o.episodes = 0;
  EXPECT_EQ(error(o), "episodes: 0 must be >= 1");
  o = Options("bert");
  EXPECT_EQ(error(o), "embedder: 'bert' is not one of model, tfidf");
  o = Options("tfidf");
  o.decode.policy.name = "snapkv";
  EXPECT_EQ(error(o),
            "policy: snapkv compresses the prompt; episodic decodes with a decode-time policy "
            "such as lazy");
  o = Options("tfidf");
  o.decode.policy.name = "nope";
  EXPECT_FALSE(error(o).empty());
}

}  // namespace
}  // namespace recall::offline
