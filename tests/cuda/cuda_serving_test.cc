// A session served on a GPU past the model's context (issue: endless sessions on CUDA): a
// Scheduler over a CUDA engine runs a compact lazy session of stories260K through many
// turns, its cache re-positioned on the device (the key re-rotation kernel) and evicted by
// the device's eviction step, its decode steps replayed as CUDA graphs; every turn is
// answered, the session passes the context twice, its KV bytes stay within budget + window
// + one chunk, and its first turn gives the CPU engine's tokens. Skips without a GPU.
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/compact_lazy.h"
#include "tests/common/stories260k.h"
#include "tests/cuda/cuda_test_util.h"
#include "worker/runtime/engine.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_collect.h"

namespace recall::serving {
namespace {

class CudaServingTest : public recall::testing::Stories260KTest {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_GPU();
    Stories260KTest::SetUp();
  }

  std::unique_ptr<Scheduler> Start(runtime::Device device, metrics::Registry* metrics) {
    runtime::Engine* e = testing::AddEngine(*model_, engines_, 1, device);
    return e == nullptr ? nullptr : testing::StartCompactLazy(*e, *tok_, metrics);
  }

  static Collected Run(Scheduler& s, const std::string& text, int history) {
    TurnRequest r;
    r.session_id = "long";
    r.messages = {{"user", text}};
    r.history_length = history;
    r.sampling.temperature = 0;
    r.max_tokens = 40;
    auto stream = s.Submit(std::move(r));
    if (!stream.ok()) return Collected{.status = stream.status()};
    return CollectTurn(**stream);
  }

  std::vector<std::unique_ptr<runtime::Engine>> engines_;
};

const auto& kLines = testing::kConversationLines;

TEST_F(CudaServingTest, ACompactSessionGoesOnPastTheContextOnTheGpu) {
  if (model_ == nullptr) return;
  metrics::Registry gpu_metrics, cpu_metrics;
  std::unique_ptr<Scheduler> gpu = Start(runtime::Device::kCuda, &gpu_metrics);
  std::unique_ptr<Scheduler> cpu = Start(runtime::Device::kCpu, &cpu_metrics);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(cpu, nullptr);
  const model::ModelConfig& c = model_->config;
  const int64_t bound = testing::CompactLazyBound(c, engines_[0]->pool(0).block_bytes(), 1,
                                                  /*on_backend=*/true);
  int64_t consumed = 0;
  int same = 0;
  for (int turn = 0; turn < 30; ++turn) {
    SCOPED_TRACE(turn);
    const Collected g = Run(*gpu, kLines[turn % 6], 2 * turn);
    const Collected h = Run(*cpu, kLines[turn % 6], 2 * turn);
    ASSERT_TRUE(g.status.ok()) << g.status;
    ASSERT_TRUE(h.status.ok()) << h.status;
    EXPECT_GT(g.summary.generated_tokens, 0);
    EXPECT_LE(g.summary.peak_kv_bytes, bound);
    if (turn == 0) {
      EXPECT_EQ(g.token_ids, h.token_ids) << "the first turn, before any eviction";
    }
    same += g.token_ids == h.token_ids ? 1 : 0;
    consumed += g.summary.prompt_tokens - g.summary.cached_tokens + g.summary.generated_tokens;
  }
  std::printf(
      "GPU session: %lld tokens through a %d-token context, %.0f compactions; %d of 30 "
      "turns gave the CPU engine's tokens\n",
      static_cast<long long>(consumed), c.max_seq_len,
      gpu_metrics.GetCounter("recall_worker_compactions_total", "")->value(), same);
  EXPECT_GT(consumed, 2 * c.max_seq_len) << "the session passed the context twice";
  EXPECT_GE(gpu_metrics.GetCounter("recall_worker_compactions_total", "")->value(), 2);
}

}  // namespace
}  // namespace recall::serving
