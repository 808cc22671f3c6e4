// Eviction under tensor parallelism (EVICTION.md section 5) on stories260K with CPU ranks:
// for each mode (uniform per-head counts, one shared token set, head-adaptive budgets) and
// policy, TP = 2 and 4 generate the TP = 1 text and keep, in every layer and KV head, exactly
// the token positions TP = 1 keeps; so do TP = 2 ranks on opaque memory with staged
// collectives (the CUDA ranks' code paths, on the CPU). The debug checksum catches ranks that
// disagree.
#include <map>
#include <tuple>

#include "gtest/gtest.h"
#include "tests/worker/runtime/tp_fixture.h"
#include "worker/model/random_model.h"

namespace recall::offline {
namespace {

using runtime::tp::CollectKeepSets;
using runtime::tp::KeepSets;
using runtime::tp::TpFixture;

using cache::eviction::SessionEvictorOptions;

enum class Mode { kUniform, kShared, kHeadAdaptive };
const char* ModeName(Mode m) {
  return m == Mode::kUniform ? "uniform" : m == Mode::kShared ? "shared" : "head_adaptive";
}

SessionEvictorOptions Options(const std::string& policy, Mode mode) {
  SessionEvictorOptions o;
  o.policy.name = policy;
  o.policy.window = 16;
  o.policy.alpha = 1e-3f;
  o.budget.budget = 48;
  o.share_tokens = mode == Mode::kShared;
  o.budget.head_adaptive = mode == Mode::kHeadAdaptive;
  o.verify_keep = true;  // every step checks that the ranks agree
  return o;
}

struct Outcome {
  std::vector<int32_t> tokens;
  KeepSets keep;
  int64_t evictions = 0;
};

class TpEvictionTest : public TpFixture,
                       public ::testing::WithParamInterface<std::tuple<std::string, Mode>> {
 protected:
  static Outcome Generate(int tp, const SessionEvictorOptions& o, bool opaque = false,
                          kernels::KvDType kv_dtype = kernels::KvDType::kF32) {
    Outcome run;
    std::unique_ptr<runtime::tp::TpGroup> group = MakeGroup(tp, opaque, kv_dtype);
    if (group == nullptr) return run;
    auto seq = TpSequence::Create(*group, o);
    EXPECT_TRUE(seq.ok()) << seq.status();
    if (!seq.ok()) return run;
    auto result = Greedy(*group, **seq, "Once upon a time, there was a little girl", 220);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return run;
    run.tokens = result->tokens;
    run.keep = CollectKeepSets(*group, **seq);
    run.evictions = result->evictions;
    return run;
  }
};

TEST_P(TpEvictionTest, KeptTokensPerLayerAndHeadEqualOneRank) {
  const auto& [policy, mode] = GetParam();
  const SessionEvictorOptions o = Options(policy, mode);
  const Outcome one = Generate(1, o);
  ASSERT_FALSE(one.tokens.empty());
  ASSERT_GT(one.evictions, 0) << "the budget must force evictions";
  // Opaque: the CUDA ranks' code paths on the CPU (device-memory copies, staged collectives).
  for (const auto& [tp, opaque] : {std::pair{2, false}, std::pair{4, false}, std::pair{2, true}}) {
    const Outcome many = Generate(tp, o, opaque);
    EXPECT_EQ(many.tokens, one.tokens) << "tp " << tp << (opaque ? " opaque" : "");
    ASSERT_EQ(many.keep.size(), one.keep.size());
    for (const auto& [key, positions] : one.keep) {
      EXPECT_EQ(many.keep.at(key), positions)
          << "tp " << tp << (opaque ? " opaque" : "") << " layer " << key.first << " KV head "
          << key.second;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, TpEvictionTest,
                         ::testing::Values(std::make_tuple("lazy", Mode::kUniform),
                                           std::make_tuple("lazy", Mode::kShared),
                                           std::make_tuple("lazy", Mode::kHeadAdaptive),
                                           std::make_tuple("h2o", Mode::kUniform),
                                           std::make_tuple("h2o", Mode::kShared),
                                           std::make_tuple("h2o", Mode::kHeadAdaptive),
                                           std::make_tuple("tova", Mode::kUniform)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, Mode>>& i) {
                           return std::get<0>(i.param) + "_" + ModeName(std::get<1>(i.param));
                         });

// Every KV type: TP = 2 keeps what one rank keeps with the same type, for a policy that reads
// attention (lazy; also on opaque memory, the CUDA ranks' paths) and one that reads the
// cached values on the host (vase; refused on device memory).
TEST_F(TpEvictionTest, EveryKvTypeKeepsTheOneRankTokens) {
  for (const kernels::KvDType t :
       {kernels::KvDType::kBF16, kernels::KvDType::kF16, kernels::KvDType::kInt8}) {
    for (const char* policy : {"lazy", "vase"}) {
      SCOPED_TRACE(std::string(kernels::KvDTypeName(t)) + " " + policy);
      const SessionEvictorOptions o = Options(policy, Mode::kUniform);
      const Outcome one = Generate(1, o, false, t);
      ASSERT_FALSE(one.tokens.empty());
      ASSERT_GT(one.evictions, 0);
      for (const bool opaque : {false, true}) {
        if (opaque && std::string(policy) == "vase") continue;
        const Outcome two = Generate(2, o, opaque, t);
        EXPECT_EQ(two.tokens, one.tokens) << (opaque ? "opaque" : "");
        EXPECT_EQ(two.keep, one.keep) << (opaque ? "opaque" : "");
      }
    }
  }
}

// Drives per-rank sequences made by hand (so that one rank can be misconfigured): greedy
// tokens from rank 0's logits; returns the first error of any step.
absl::Status RunByHand(runtime::tp::TpGroup& group,
                       const std::vector<SessionEvictorOptions>& per_rank,
                       const std::vector<int32_t>& prompt, int steps) {
  std::vector<std::unique_ptr<LocalSequence>> seqs;
  for (int r = 0; r < group.tp(); ++r) {
    auto s = LocalSequence::Create(group.forward(r), group.pool(r), per_rank[r]);
    if (!s.ok()) return s.status();
    seqs.push_back(std::move(*s));
  }
  std::vector<float> logits(group.full_model().config.vocab_size);
  absl::Status st = group.Run(
      [&](int r) { return seqs[r]->Prefill(prompt, 64, r == 0 ? logits.data() : nullptr); });
  for (int i = 0; i < steps && st.ok(); ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    st = group.Run([&](int r) { return seqs[r]->Decode(next, r == 0 ? logits.data() : nullptr); });
  }
  return st;
}

class TpChecksumTest : public TpFixture {};

TEST_F(TpChecksumTest, ASharedTokenSetDisagreementFailsLoudly) {
  std::unique_ptr<runtime::tp::TpGroup> group = MakeGroup(2);
  ASSERT_NE(group, nullptr);
  const std::vector<int32_t> prompt = tok_->Encode("Once upon a time", true);
  std::vector<SessionEvictorOptions> o;
  for (int r = 0; r < 2; ++r)
    o.push_back(RankEvictorOptions(*group, r, Options("lazy", Mode::kShared)));
  // Agreeing ranks pass the check at every step.
  ASSERT_TRUE(RunByHand(*group, o, prompt, 150).ok());
  // Rank 1 thinks a token is important at another threshold: its ts/mri, and so its keep
  // set, drift from rank 0's. The checksum must stop the run at the first such eviction.
  o[1].policy.alpha = 0.2f;
  absl::Status st = RunByHand(*group, o, prompt, 150);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("diverged"), std::string::npos) << st;
}

TEST_F(TpChecksumTest, ReplicatedKvHeadsThatDisagreeFailLoudly) {
  // 8 query heads over 4 KV heads at tp = 8: every KV head lives on two ranks.
  model::ModelConfig c = model_->config;
  c.hidden_dim = 176;
  c.n_layers = 2;
  auto random = model::MakeRandomModel(c, kernels::DType::kF32, 7);
  ASSERT_TRUE(random.ok()) << random.status();
  runtime::tp::TpGroupOptions go;
  go.tp = 8;
  go.threads_per_rank = 1;
  go.kv_bytes_per_rank = 4ll << 20;
  auto group = runtime::tp::TpGroup::Create(**random, go);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<int32_t> prompt(30, 7);
  std::vector<SessionEvictorOptions> o;
  for (int r = 0; r < 8; ++r) {
    o.push_back(RankEvictorOptions(**group, r, Options("lazy", Mode::kUniform)));
  }
  ASSERT_TRUE(RunByHand(**group, o, prompt, 80).ok());
  o[3].policy.window = 8;  // rank 3 evicts at other steps than its replica, rank 2
  absl::Status st = RunByHand(**group, o, prompt, 80);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("ranks 2 and 3"), std::string::npos) << st;
}

// Compact positions on TP ranks (TpSequence decides pieces, steps and re-positioning for the
// group): a prompt of twice the context and a reply past it give the one-rank tokens, with
// ranks whose lengths differ (head-adaptive h2o) and whose budgets are uniform (lazy). Each
// rank deciding alone, `recall generate --tp 2` ended at the context (508 tokens).
TEST_F(TpChecksumTest, CompactPositionsGoPastTheContextAsOneRankDoes) {
  std::string prompt;
  for (int i = 0; i < 80; ++i) prompt += "Once upon a time there was a little girl. ";
  for (const auto& [policy, mode] :
       {std::pair{"h2o", Mode::kHeadAdaptive}, std::pair{"lazy", Mode::kUniform}}) {
    std::vector<int32_t> one;
    for (const int tp : {1, 2}) {
      std::unique_ptr<runtime::tp::TpGroup> group = MakeGroup(tp);
      ASSERT_NE(group, nullptr);
      auto seq = TpSequence::Create(*group, Options(policy, mode), runtime::Positions::kCompact);
      ASSERT_TRUE(seq.ok()) << seq.status();
      EXPECT_TRUE((*seq)->endless());
      auto result = Greedy(*group, **seq, prompt, 300);
      ASSERT_TRUE(result.ok()) << policy << " tp " << tp << ": " << result.status();
      EXPECT_EQ(result->finish_reason, FinishReason::kLength) << policy << " tp " << tp;
      EXPECT_EQ(result->tokens.size(), 300u);
      EXPECT_GT(result->prompt_tokens + 300, 2 * model_->config.max_seq_len);
      if (tp == 1) {
        one = result->tokens;
      } else {
        EXPECT_EQ(result->tokens, one) << policy;
      }
    }
  }
}

TEST_F(TpChecksumTest, OptionsThatCannotShareTokensAreRejected) {
  std::unique_ptr<runtime::tp::TpGroup> group = MakeGroup(2);
  ASSERT_NE(group, nullptr);
  for (const char* policy : {"rkv", "snapkv"}) {
    auto seq = TpSequence::Create(*group, Options(policy, Mode::kShared));
    EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument) << policy;
    EXPECT_NE(seq.status().message().find("tp_eviction shared does not apply"), std::string::npos)
        << seq.status();
  }
  SessionEvictorOptions both = Options("lazy", Mode::kShared);
  both.budget.head_adaptive = true;
  EXPECT_EQ(TpSequence::Create(*group, both).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recall::offline
