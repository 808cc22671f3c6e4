// EvaluatePolicies and EvaluateEpisodic on the real stories260K model: what they report
// against FullKV (an unbudgeted cache agrees everywhere, a small budget holds its memory,
// the two FullKV paths agree) on a small conversation in the training format.
#include "bench/quality/conversation_eval.h"

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/common/stories260k.h"
#include "worker/runtime/forward.h"

namespace recall::bench {
namespace {

// stories260K's tokenizer with "\n" as its byte piece <0x0A>.
class NewlineTokenizer final : public model::Tokenizer {
 public:
  explicit NewlineTokenizer(const model::Tokenizer& base) : base_(base) {}
  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
    return base_.Encode(text, add_bos, parse_special);
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return base_.Decode(ids, skip_special);
  }
  std::string TokenBytes(int32_t prev, int32_t id) const override {
    return base_.TokenBytes(prev, id);
  }
  int vocab_size() const override { return base_.vocab_size(); }
  int32_t bos_id() const override { return base_.bos_id(); }
  int32_t eos_id() const override { return base_.eos_id(); }
  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    return base_.PieceToId(piece == "\n" ? "<0x0A>" : piece);
  }

 private:
  const model::Tokenizer& base_;
};

constexpr char kText[] =
    "Lily had a dog named Max. Max liked to run in the park.\\n"
    "One day Lily and Max went to the big park.\\n"
    "They saw a red ball under a tree.\\n"
    "Max ran to the ball and picked it up.\\n"
    "Lily laughed and clapped her hands.\\n"
    "Tom lived next door. He had a cat named Tiger.\\n"
    "Tiger liked to sleep in the sun all day.\\n"
    "One day Tiger climbed up a tall tree.\\n"
    "Tom was sad because Tiger did not come down.\\n"
    "His mom helped him get Tiger down.\\n"
    "Sue had a small bird. The bird could sing.\\n"
    "Every morning the bird sang a happy song.\\n"
    "Sue gave the bird some seeds and water.\\n"
    "The bird was happy and sang again.\\n"
    "Ben had a big red truck. He liked to play with it.\\n"
    "He took the truck to the sand box.\\n"
    "The truck carried sand all day long.\\n"
    "Ben was very happy with his truck.\\n";

class ConversationEvalTest : public testing::Stories260KTest {
 protected:
  void SetUp() override {
    Stories260KTest::SetUp();
    if (model_ == nullptr) return;
    nl_tok_ = std::make_unique<NewlineTokenizer>(*tok_);
    backend_ = kernels::CreateCpuBackend({1});
    const model::ModelConfig& mc = model_->config;
    const kernels::PagedKvLayout layout{mc.n_layers, mc.n_kv_heads, mc.head_dim, 16};
    auto pool = cache::BlockPool::Create(layout, mc.n_layers * 8 * (512 / 16 + 2));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    forward_ =
        std::make_unique<runtime::ForwardPass>(*model_, *backend_, runtime::ForwardOptions{256});
    const std::string path = testing::MakeTempDir("conversation_eval") + "/c.jsonl";
    std::ofstream(path) << R"({"seed": 3, "text": ")" << kText
                        << R"(", "questions": [{"q": "What was the dog called?", "a": "Max", )"
                        << R"("distance_tokens": 600}, {"q": "Who had a truck?", "a": "Ben", )"
                        << R"("distance_tokens": 40}]})"
                        << "\n";
    auto convs = LoadQaConversations(path, *nl_tok_, 0, 0, mc.max_seq_len);
    ASSERT_TRUE(convs.ok()) << convs.status();
    conv_ = (*convs)[0];
  }

  std::vector<ConvMethod> Methods(const std::vector<std::string>& labels, int budget) {
    std::vector<ConvMethod> out;
    for (const std::string& l : labels) {
      auto m = ParseConvMethod(l);
      EXPECT_TRUE(m.ok()) << m.status();
      m->budget_tokens = budget;
      out.push_back(*m);
    }
    return out;
  }

  std::unique_ptr<NewlineTokenizer> nl_tok_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<runtime::ForwardPass> forward_;
  QaConversation conv_;
};

TEST_F(ConversationEvalTest, AnUnbudgetedCacheAgreesWithFullKV) {
  if (model_ == nullptr) return;
  ASSERT_GT(conv_.conversation_tokens, 200);
  const auto methods = Methods({"streaming", "h2o", "lazy"}, model_->config.max_seq_len);
  std::vector<ConvStats> stats(methods.size());
  ConvStats full;
  ASSERT_TRUE(EvaluatePolicies(*forward_, *pool_, conv_, methods, {}, &stats, &full).ok());
  EXPECT_EQ(full.questions, 2);
  EXPECT_EQ(full.agree, 2);
  EXPECT_EQ(full.far, 1);
  for (const ConvStats& s : stats) {
    EXPECT_EQ(s.questions, 2);
    EXPECT_EQ(s.agree, 2);
    EXPECT_EQ(s.token_agree, s.answer_tokens);
    EXPECT_EQ(s.correct, full.correct);
    EXPECT_EQ(s.full_correct, full.correct);
    EXPECT_DOUBLE_EQ(s.kv_fraction_sum / s.kv_samples, 1.0);
  }
}

TEST_F(ConversationEvalTest, ASmallBudgetHoldsItsMemory) {
  if (model_ == nullptr) return;
  const auto methods = Methods({"streaming", "lazy"}, 32);
  std::vector<ConvStats> stats(methods.size());
  ConvStats full;
  ASSERT_TRUE(EvaluatePolicies(*forward_, *pool_, conv_, methods, {}, &stats, &full).ok());
  std::vector<int> starts;
  const double len = static_cast<double>(QaSequence(conv_, &starts).size());
  for (size_t i = 0; i < stats.size(); ++i) {
    // 32 slots, lazy's lag of W = 16 and one 16-token block of rounding at most.
    EXPECT_LE(stats[i].kv_fraction_sum, (32 + 16 + 16) / len) << methods[i].label;
    EXPECT_NEAR(stats[i].budget_fraction_sum, 32.0 / conv_.conversation_tokens, 1e-12);
    EXPECT_EQ(stats[i].questions, 2);
  }
}

TEST_F(ConversationEvalTest, EpisodicAgainstItsOwnFullKV) {
  if (model_ == nullptr) return;
  conv_.questions.resize(1);  // one question: both FullKV paths see the same prompt
  std::vector<ConvStats> pstats;
  ConvStats full;
  ASSERT_TRUE(EvaluatePolicies(*forward_, *pool_, conv_, {}, {}, &pstats, &full).ok());

  auto methods = Methods({"episodic-tfidf", "episodic-tfidf"}, 0);
  methods[0].budget_tokens = model_->config.max_seq_len;  // fits: not clustered, no eviction
  methods[1].budget_tokens = 48;
  ConvEvalOptions o;
  o.block_tokens = 96;
  o.episodes = 2;
  std::vector<ConvStats> stats(methods.size());
  ConvStats full_1q;
  absl::Status s =
      EvaluateEpisodic(*forward_, *pool_, *nl_tok_, conv_, methods, o, &stats, &full_1q);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(full_1q.questions, 1);
  EXPECT_EQ(full_1q.correct, full.correct);
  EXPECT_EQ(stats[0].agree, 1);
  // The full cache's bytes, and lazy's state beside them (the decode policy): ts and mri, 8
  // bytes per slot and KV head against 64 of f32 K and V, with the state's slack.
  EXPECT_NEAR(stats[0].kv_fraction_sum, 1.0 + 8.0 / 64, 0.03);
  EXPECT_EQ(stats[1].questions, 1);
  EXPECT_LT(stats[1].kv_fraction_sum, 0.8);
}

TEST(ConvMethodTest, ParsesLabelsAndBudgets) {
  auto e = ParseConvMethod("episodic-model");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->episodic);
  EXPECT_EQ(e->embedder, "model");
  auto p = ParseConvMethod("lazy");
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->episodic);
  EXPECT_EQ(p->policy, "lazy");
  EXPECT_FALSE(ParseConvMethod("").ok());
  QaConversation c;
  c.conversation_tokens = 1001;
  p->fraction = 0.1;
  EXPECT_EQ(p->Budget(c), 101);
  p->budget_tokens = 512;
  EXPECT_EQ(p->Budget(c), 512);
}

}  // namespace
}  // namespace recall::bench
