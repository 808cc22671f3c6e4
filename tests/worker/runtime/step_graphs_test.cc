// Decode steps run as recorded graphs (worker/runtime/step_graphs.h) on a backend that records
// the way a CUDA graph does (tests/kernels/recording_backend.h): their logits, picks and
// probabilities equal, bit for bit, the same steps launched op by op, while batch shapes
// change, caches grow past block and bucket boundaries and the metadata buffer moves.
#include "worker/runtime/step_graphs.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "cache/block_pool.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/sampling.h"
#include "tests/common/tiny_model.h"
#include "tests/kernels/recording_backend.h"
#include "worker/model/random_model.h"
#include "worker/runtime/forward.h"

namespace recall::runtime {
namespace {

using kernels::testing::RecordingBackend;

constexpr int kItems = 3, kVocab = 97;

TEST(StepGraphsTest, BucketLengthCoversWithLittleSpare) {
  std::set<int> buckets;
  for (int len = 1; len <= 20000; ++len) {
    const int b = StepGraphs::BucketLength(len);
    ASSERT_GE(b, len);
    ASSERT_EQ(b % 64, 0) << len;
    ASSERT_LT(b - len, std::max(64, len / 4 + 1)) << len;
    ASSERT_GE(StepGraphs::BucketLength(len + 1), b) << "monotone at " << len;
    if (len <= 8192) buckets.insert(b);
  }
  EXPECT_EQ(StepGraphs::BucketLength(0), 0);
  // 64 .. 256 in steps of 64, then four per doubling up to 8192.
  EXPECT_EQ(buckets.size(), 4u + 4u * 5u) << "buckets up to an 8K context";
}

// Two forward passes over the same random model, each with its own pool and sequences: one on
// the recording backend with step graphs, one on the CPU backend over opaque memory.
struct Rig {
  std::unique_ptr<kernels::Backend> backend;
  RecordingBackend* recorder = nullptr;
  std::unique_ptr<cache::BlockPool> pool;
  std::unique_ptr<ForwardPass> forward;
  std::vector<std::unique_ptr<cache::SequenceCache>> seqs;
};

class StepGraphsForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = model::MakeRandomModel(testing::TinyModelConfig(2, 512), kernels::DType::kF32, 11);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    graphed_ = Make(true);
    plain_ = Make(false);
  }

  // Prompts of 40, 55 and 70 tokens, block size 4 (the tables grow every 4 steps).
  Rig Make(bool record) {
    Rig r;
    if (record) {
      auto rec = std::make_unique<RecordingBackend>();
      r.recorder = rec.get();
      r.backend = std::move(rec);
    } else {
      kernels::CpuBackendOptions o;
      o.num_threads = 1;
      o.opaque_memory = true;
      r.backend = kernels::CreateCpuBackend(o);
    }
    const model::ModelConfig& c = model_->config;
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 4}, 256,
                                         r.backend->memory());
    EXPECT_TRUE(pool.ok()) << pool.status();
    r.pool = std::move(*pool);
    r.forward = std::make_unique<ForwardPass>(*model_, *r.backend, ForwardOptions{64});
    for (int i = 0; i < kItems; ++i) {
      r.seqs.push_back(std::make_unique<cache::SequenceCache>(r.pool.get()));
      std::vector<int32_t> t(static_cast<size_t>(40 + 15 * i));
      for (size_t j = 0; j < t.size(); ++j)
        t[j] = static_cast<int32_t>((j * 13 + i * 7 + 1) % kVocab);
      EXPECT_TRUE(RunChunked(*r.forward, r.seqs.back().get(), t, 32, nullptr).ok());
    }
    return r;
  }

  // One decode step of the items in `which` on both rigs: item i feeds token[i]; items 0 and 2
  // leave their probabilities in backend memory and pick their next token there (item 2
  // sampled), item 1 gets its logits and host probabilities. Expects equal outputs and
  // returns the greedy next token of each item.
  void Step(const std::vector<int>& which, std::vector<int32_t>& token, int step) {
    const model::ModelConfig& c = model_->config;
    const int64_t stride = 256;
    const size_t rows = static_cast<size_t>(c.n_layers) * c.n_heads;
    kernels::SamplingParams sampled;
    sampled.temperature = 0.9f;
    sampled.top_p = 0.9f;
    struct Out {
      std::vector<float> logits;
      std::vector<int32_t> picks;
      std::vector<std::vector<float>> probs;
    } out[2];
    Rig* rigs[2] = {&graphed_, &plain_};
    for (int r = 0; r < 2; ++r) {
      Rig& rig = *rigs[r];
      Out& o = out[r];
      o.logits.assign(which.size() * kVocab, 0.0f);
      o.picks.assign(which.size(), -1);
      o.probs.assign(which.size(), std::vector<float>(rows * stride, 0.0f));
      std::vector<BatchItem> items(which.size());
      for (size_t k = 0; k < which.size(); ++k) {
        const int i = which[k];
        BatchItem& item = items[k];
        item.cache = rig.seqs[i].get();
        item.tokens = &token[i];
        item.n = 1;
        if (i == 1) {
          item.attn_probs = o.probs[k].data();
          item.probs_stride = stride;
        } else {
          item.probs_on_backend = true;
          item.pick = &o.picks[k];
          if (i == 2) {
            item.sampling = &sampled;
            item.draw = static_cast<float>((step * 37 % 100) + 0.5f) / 100.0f;
          }
        }
      }
      ASSERT_TRUE(rig.forward->Run(items, o.logits.data()).ok()) << "step " << step;
      for (size_t k = 0; k < which.size(); ++k) {
        int64_t s = 0;
        const float* p = rig.forward->backend_probs(k, &s);
        if (p == nullptr) continue;
        std::vector<float> got(rows * static_cast<size_t>(s));
        rig.backend->memory().CopyOut(got.data(), p, got.size() * sizeof(float));
        for (size_t row = 0; row < rows; ++row) {
          std::copy_n(got.data() + row * s, std::min<int64_t>(s, stride),
                      o.probs[k].data() + row * stride);
        }
      }
    }
    for (size_t k = 0; k < which.size(); ++k) {
      const int i = which[k];
      if (i == 1) {
        for (int v = 0; v < kVocab; ++v) {
          ASSERT_EQ(out[0].logits[k * kVocab + v], out[1].logits[k * kVocab + v])
              << "step " << step << " item " << i << " logit " << v;
        }
        token[i] = kernels::cpu::ArgMax(out[0].logits.data() + k * kVocab, kVocab);
      } else {
        ASSERT_EQ(out[0].picks[k], out[1].picks[k]) << "step " << step << " item " << i;
        token[i] = out[0].picks[k];
      }
      const int len = plain_.seqs[i]->max_length();
      for (size_t row = 0; row < rows; ++row) {
        for (int slot = 0; slot < len; ++slot) {
          ASSERT_EQ(out[0].probs[k][row * stride + slot], out[1].probs[k][row * stride + slot])
              << "step " << step << " item " << i << " row " << row << " slot " << slot;
        }
      }
    }
  }

  std::unique_ptr<model::Model> model_;
  Rig graphed_, plain_;
};

TEST_F(StepGraphsForwardTest, ReplayedStepsEqualStepsRunOpByOp) {
  std::vector<int32_t> token = {5, 6, 7};
  // Mostly all three items; every fifth step only items 0 and 2 (another batch shape). The
  // caches go from 40-70 slots to 104-150: past the 64 and 128 buckets, and past a block
  // every 4 steps.
  for (int step = 0; step < 80; ++step) {
    const std::vector<int> which =
        step % 5 == 4 ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2};
    ASSERT_NO_FATAL_FAILURE(Step(which, token, step));
  }
  const StepGraphs& graphs = graphed_.forward->step_graphs();
  EXPECT_TRUE(graphs.enabled()) << "the first graph passed its check";
  EXPECT_GE(graphs.recorded(), 4) << "per batch shape and length bucket";
  EXPECT_GE(graphs.replays(), 60) << "most steps replay a graph";
  EXPECT_EQ(graphed_.recorder->replays(), graphs.replays() + 1) << "and the first one's check";
  EXPECT_EQ(graphed_.recorder->coverage_violations(), 0)
      << "every replay's attention grid covered its caches";
  EXPECT_EQ(plain_.forward->step_graphs().recorded(), 0) << "the CPU backend cannot record";
}

TEST_F(StepGraphsForwardTest, StaleGraphsAreRecordedAgain) {
  std::vector<int32_t> token = {5, 6, 7};
  for (int step = 0; step < 10; ++step) ASSERT_NO_FATAL_FAILURE(Step({0, 1, 2}, token, step));
  const int64_t recorded = graphed_.forward->step_graphs().recorded();
  const int64_t replays = graphed_.forward->step_graphs().replays();
  ASSERT_GT(replays, 0);
  graphed_.recorder->MoveWorkspace();
  for (int step = 10; step < 20; ++step) ASSERT_NO_FATAL_FAILURE(Step({0, 1, 2}, token, step));
  EXPECT_GT(graphed_.forward->step_graphs().recorded(), recorded) << "recorded again";
  EXPECT_GT(graphed_.forward->step_graphs().replays(), replays) << "and replayed";
  EXPECT_EQ(graphed_.recorder->coverage_violations(), 0);
}

TEST_F(StepGraphsForwardTest, StepsAfterTheMetadataMovedGetTheirOwnGraphs) {
  std::vector<int32_t> token = {5, 6, 7};
  for (int step = 0; step < 6; ++step) ASSERT_NO_FATAL_FAILURE(Step({0, 1, 2}, token, step));
  const int64_t recorded = graphed_.forward->step_graphs().recorded();
  // Prefill chunks of three sequences in one batch, on both rigs: their metadata outgrows
  // the buffer, which moves.
  std::vector<int32_t> prompt(21);
  for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = static_cast<int32_t>(j * 5 % kVocab);
  for (Rig* rig : {&graphed_, &plain_}) {
    for (int round = 0; round < 2; ++round) {
      BatchItem items[3];
      for (int i = 0; i < 3; ++i)
        items[i] = BatchItem{rig->seqs[i].get(), prompt.data(), 21, false};
      ASSERT_TRUE(rig->forward->Run(items, nullptr).ok());
    }
  }
  for (int step = 6; step < 12; ++step) ASSERT_NO_FATAL_FAILURE(Step({0, 1, 2}, token, step));
  EXPECT_GT(graphed_.forward->step_graphs().recorded(), recorded);
  EXPECT_EQ(graphed_.recorder->coverage_violations(), 0);
}

TEST_F(StepGraphsForwardTest, AGraphThatDiffersFromItsOpsTurnsGraphsOff) {
  graphed_.recorder->skip_last_op_on_replay = true;  // a broken graph
  std::vector<int32_t> token = {5, 6, 7};
  for (int step = 0; step < 12; ++step) ASSERT_NO_FATAL_FAILURE(Step({0, 1, 2}, token, step));
  const StepGraphs& graphs = graphed_.forward->step_graphs();
  EXPECT_FALSE(graphs.enabled());
  EXPECT_EQ(graphs.recorded(), 1) << "only the first graph, which failed its check";
  EXPECT_EQ(graphs.replays(), 0);
}

TEST_F(StepGraphsForwardTest, StepsWithPrefillOrHostCapturesAreNotRecorded) {
  const model::ModelConfig& c = model_->config;
  // A prefill chunk next to a decode step, twice: never recorded.
  const int32_t two[2] = {3, 4};
  const int32_t one = 9;
  for (int round = 0; round < 2; ++round) {
    BatchItem items[2] = {BatchItem{graphed_.seqs[0].get(), two, 2, false},
                          BatchItem{graphed_.seqs[1].get(), &one, 1, false}};
    ASSERT_TRUE(graphed_.forward->Run(items, nullptr).ok());
  }
  // Decode steps that capture window queries or hidden states (host copies mid-step).
  std::vector<float> queries(static_cast<size_t>(c.n_layers) * c.n_heads * c.head_dim);
  std::vector<float> hidden(static_cast<size_t>(c.dim));
  for (int round = 0; round < 2; ++round) {
    BatchItem q{graphed_.seqs[2].get(), &one, 1, false};
    q.window_queries = queries.data();
    q.window_w = 1;
    q.window_first = graphed_.seqs[2]->next_position();
    ASSERT_TRUE(graphed_.forward->Run({&q, 1}, nullptr).ok());
    BatchItem h{graphed_.seqs[2].get(), &one, 1, false};
    h.hidden_sum = hidden.data();
    h.hidden_layer = 0;
    ASSERT_TRUE(graphed_.forward->Run({&h, 1}, nullptr).ok());
  }
  EXPECT_EQ(graphed_.forward->step_graphs().recorded(), 0);
  EXPECT_TRUE(graphed_.recorder->refused().empty()) << "nothing was even tried";
  EXPECT_NE(queries[0], 0.0f) << "the queries were captured";
}

TEST_F(StepGraphsForwardTest, StepGraphsOffRunsEveryStepDirectly) {
  ForwardPass off(*model_, *graphed_.backend,
                  ForwardOptions{.max_batch_tokens = 64, .step_graphs = false});
  const int32_t one = 9;
  for (int step = 0; step < 4; ++step) {
    BatchItem item{graphed_.seqs[0].get(), &one, 1, false};
    ASSERT_TRUE(off.Run({&item, 1}, nullptr).ok());
  }
  EXPECT_EQ(off.step_graphs().recorded(), 0);
  EXPECT_EQ(graphed_.recorder->recordings(), 0);
}

}  // namespace
}  // namespace recall::runtime
