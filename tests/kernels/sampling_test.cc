// Sample: greedy argmax and its tie rule, repetition and reply penalties, top-k / top-p limits that
// reduce to greedy, seed reproducibility, and draw frequencies over many fixed-seed draws.
#include "kernels/cpu/sampling.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/reference.h"

namespace recall::kernels {
namespace {

class SamplingTest : public ::testing::Test {
 protected:
  int32_t Sample(std::vector<float> logits, const SamplingParams& p, Rng& rng,
                 const std::vector<int32_t>& history = {}) {
    return backend_->Sample(logits.data(), logits.size(), p, rng, history.data(), history.size());
  }
  // Frequencies of each token over `draws` draws with a fixed seed.
  std::vector<double> Frequencies(const std::vector<float>& logits, const SamplingParams& p,
                                  int draws) {
    Rng rng(p.seed);
    std::vector<double> freq(logits.size(), 0.0);
    for (int i = 0; i < draws; ++i) freq[Sample(logits, p, rng)] += 1.0 / draws;
    return freq;
  }
  static SamplingParams Greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend({2});
};

// Scenario: temperature 0 returns the argmax and does not advance the rng.
TEST_F(SamplingTest, GreedyIsArgmax) {
  Rng rng(1);
  const uint64_t state = rng.state;
  EXPECT_EQ(Sample({0.1f, 3.0f, -2.0f, 2.9f}, Greedy(), rng), 1);
  EXPECT_EQ(rng.state, state);
}

// Scenario: equal maxima pick the lowest id.
TEST_F(SamplingTest, GreedyTieGoesToLowestId) {
  Rng rng(1);
  EXPECT_EQ(Sample({1.0f, 5.0f, 2.0f, 5.0f, 5.0f}, Greedy(), rng), 1);
}

// Scenario: penalty 2 over history {0, 0, 2}: logit 2.0 of token 0 becomes 1.0 (divided
// once, not per occurrence), so token 1 (1.5) wins greedy; negative logit of token 2 is
// multiplied: -1 -> -2; untouched token 3 keeps its logit.
TEST_F(SamplingTest, RepetitionPenaltyChangesArgmax) {
  std::vector<float> logits = {2.0f, 1.5f, -1.0f, 0.5f};
  SamplingParams p = Greedy();
  Rng rng(1);
  EXPECT_EQ(Sample(logits, p, rng, {0, 0, 2}), 0) << "penalty 1 (off) keeps token 0";
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> history = {0, 0, 2};
  EXPECT_EQ(backend_->Sample(logits.data(), 4, p, rng, history.data(), 3), 1);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 1.5f, -2.0f, 0.5f}));
}

// Scenario: a logit bias is added after the repetition penalty, for greedy and sampled picks:
// +100 on token 3 makes it the pick at any temperature, -100 on the argmax hands greedy to the
// next token; either keeps the pick off the backend (SamplesOnBackend).
TEST_F(SamplingTest, LogitBiasMovesThePickAndKeepsItOnTheHost) {
  const std::vector<float> logits = {2.0f, 1.5f, -1.0f, 0.5f};
  SamplingParams p = Greedy();
  EXPECT_TRUE(SamplesOnBackend(p));
  p.logit_bias = {{3, 100.0f}};
  EXPECT_FALSE(SamplesOnBackend(p));
  Rng rng(5);
  EXPECT_EQ(Sample(logits, p, rng), 3);
  p.temperature = 1.0f;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(Sample(logits, p, rng), 3) << "draw " << i;
  p = Greedy();
  p.logit_bias = {{0, -100.0f}, {99, 50.0f}};  // an id past the vocabulary is skipped
  EXPECT_EQ(Sample(logits, p, rng), 1);
  p.repetition_penalty = 2.0f;  // token 1: 1.5 / 2 = 0.75 (penalized first), then token 3 wins
  p.logit_bias = {{0, -100.0f}, {3, 0.3f}};
  EXPECT_EQ(Sample(logits, p, rng, {1}), 3);
}

// Scenario: OpenAI's penalties count the reply's tokens: frequency_penalty per occurrence,
// presence_penalty once per distinct token; ids outside the vocabulary are skipped; either
// keeps the pick off the backend.
TEST_F(SamplingTest, ReplyPenaltiesSubtractPerCountAndPerPresence) {
  std::vector<float> logits = {2.0f, 1.5f, -1.0f, 0.5f};
  SamplingParams p = Greedy();
  const std::vector<int32_t> reply = {0, 3, 0, 7, 0, -1};
  cpu::ApplyReplyPenalties(logits.data(), 4, p, reply.data(), 6);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, 1.5f, -1.0f, 0.5f})) << "both 0: unchanged";
  p.frequency_penalty = 0.25f;
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(SamplesOnBackend(p));
  cpu::ApplyReplyPenalties(logits.data(), 4, p, reply.data(), 6);
  // token 0: 3 times -> 2 - 0.75 - 0.5; token 3: once -> 0.5 - 0.25 - 0.5; 1 and 2 unseen.
  EXPECT_EQ(logits, (std::vector<float>{0.75f, 1.5f, -1.0f, -0.25f}));
  Rng rng(1);
  EXPECT_EQ(backend_->Sample(logits.data(), 4, p, rng, nullptr, 0), 1) << "token 0 lost the lead";
  p.frequency_penalty = -1.0f;  // negative values encourage repeats
  p.presence_penalty = 0.0f;
  std::vector<float> again = {2.0f, 1.5f, -1.0f, 0.5f};
  cpu::ApplyReplyPenalties(again.data(), 4, p, reply.data(), 2);
  EXPECT_EQ(again, (std::vector<float>{3.0f, 1.5f, -1.0f, 1.5f}));
}

// Scenario: over random logits and seeds, top_k = 1 and top_p = 1e-6 (temperature 0.8)
// always return the greedy token.
TEST_F(SamplingTest, TopKOneAndTinyTopPAreGreedy) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> logits = testing::RandomVector(1000, seed, -5.0f, 5.0f);
    Rng rng(seed);
    const int32_t greedy = Sample(logits, Greedy(), rng);
    SamplingParams k1;
    k1.temperature = 0.8f;
    k1.top_k = 1;
    EXPECT_EQ(Sample(logits, k1, rng), greedy) << "seed " << seed;
    SamplingParams p0;
    p0.temperature = 0.8f;
    p0.top_p = 1e-6f;
    EXPECT_EQ(Sample(logits, p0, rng), greedy) << "seed " << seed;
  }
}

// Scenario: two rngs with the same seed give the same 200-token sequence; another seed
// gives a different one.
TEST_F(SamplingTest, SameSeedSameSequence) {
  const std::vector<float> logits = testing::RandomVector(500, 9, -2.0f, 2.0f);
  SamplingParams p;
  p.top_k = 50;
  p.top_p = 0.9f;
  auto run = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(Sample(logits, p, rng));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// Scenario: probabilities (0.5, 0.3, 0.2); 20000 fixed-seed draws land within 0.02 of the
// expected frequency at temperature 1, at temperature 0.5 (p^2 renormalised), with
// top_k = 2 (0.625, 0.375, 0) and with top_p = 0.7 (tokens 0 and 1 only).
TEST_F(SamplingTest, DrawFrequencies) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    std::vector<double> expected;
  };
  const double z = 0.25 + 0.09 + 0.04;
  const std::vector<Case> cases = {
      {1.0f, 0, 1.0f, {0.5, 0.3, 0.2}},
      {0.5f, 0, 1.0f, {0.25 / z, 0.09 / z, 0.04 / z}},
      {1.0f, 2, 1.0f, {0.625, 0.375, 0.0}},
      {1.0f, 0, 0.7f, {0.625, 0.375, 0.0}},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.seed = 1234;
    const std::vector<double> freq = Frequencies(logits, p, 20000);
    for (int t = 0; t < 3; ++t) {
      EXPECT_NEAR(freq[t], c.expected[t], 0.02)
          << "T " << c.temperature << " k " << c.top_k << " p " << c.top_p << " token " << t;
    }
  }
}

// Scenario: SampleRows (the host default every backend is checked against) picks, for each
// row, what Sample picks from a copy of that row when its draw is the one Sample's rng would
// give: greedy, temperature alone, top-k, top-p and both; the rows are left unscaled.
TEST_F(SamplingTest, SampleRowsPicksWhatSampleWouldWithTheSameDraw) {
  const int cols = 700;
  std::vector<SamplingParams> params(10);
  for (size_t r = 0; r < params.size(); ++r) {
    SamplingParams& p = params[r];
    p.temperature = r == 0 ? 0.0f : 0.4f + 0.2f * static_cast<float>(r % 5);
    p.top_k = r % 3 == 1 ? 40 : 0;
    p.top_p = r % 4 == 2 ? 0.8f : 1.0f;
    p.seed = 100 + r;
  }
  const std::vector<float> x = testing::RandomVector(params.size() * cols, 5, -4.0f, 4.0f);
  for (int round = 0; round < 20; ++round) {
    std::vector<float> draws(params.size());
    std::vector<int32_t> want(params.size());
    for (size_t r = 0; r < params.size(); ++r) {
      Rng rng(params[r].seed + 1000 * round);
      Rng peek = rng;
      draws[r] = peek.NextFloat();
      want[r] = Sample({x.begin() + r * cols, x.begin() + (r + 1) * cols}, params[r], rng);
    }
    std::vector<float> rows = x;
    std::vector<int32_t> got(params.size(), -1);
    backend_->SampleRows(rows.data(), params.size(), cols, params.data(), draws.data(),
                         got.data());
    EXPECT_EQ(got, want) << "round " << round;
    EXPECT_EQ(rows, x);
  }
}

}  // namespace
}  // namespace recall::kernels
