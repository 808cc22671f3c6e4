// Shared setup of the tensor-parallel tests: stories260K (8 query heads, 4 KV heads) and its
// tokenizer, loaded once; helpers that run one greedy generation on a TpGroup of a given size
// and collect what its ranks keep.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "worker/model/loader.h"
#include "worker/offline/generator.h"
#include "worker/offline/tp_sequence.h"
#include "worker/runtime/tp/tp_group.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::runtime::tp {

inline constexpr char kModelFile[] = "models/stories260K/stories260K.bin";
inline constexpr char kTokenizerFile[] = "models/stories260K/tok512.bin";

// What a TP sequence keeps: (layer, model-global KV head) -> positions of the kept slots,
// over every rank (replicated KV heads must agree).
using KeepSets = std::map<std::pair<int, int>, std::vector<int32_t>>;

inline KeepSets CollectKeepSets(TpGroup& group, const offline::TpSequence& seq) {
  KeepSets out;
  for (int r = 0; r < group.tp(); ++r) {
    const cache::SequenceCache& c = seq.rank(r).cache();
    const kernels::PagedKvLayout layout = c.View().layout;
    for (int l = 0; l < layout.n_layers; ++l) {
      for (int h = 0; h < layout.n_kv_heads; ++h) {
        std::vector<int32_t> pos;
        for (int s = 0; s < c.length(l, h); ++s) pos.push_back(c.position(l, h, s));
        const auto key = std::make_pair(l, group.layout(r).kv_head_offset + h);
        if (out.count(key) > 0) {
          EXPECT_EQ(out[key], pos) << "replicas of a KV head differ";
        }
        out[key] = pos;
      }
    }
  }
  return out;
}

class TpFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(testing::SharedPath(kModelFile))) return;
    auto m = model::LoadLlama2c(testing::SharedPath(kModelFile));
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m).release();
    auto t = model::LoadTokenizer(testing::SharedPath(kTokenizerFile), 512);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tok_;
    model_ = nullptr;
    tok_ = nullptr;
  }
  void SetUp() override { RECALL_REQUIRE_SHARED_FILE(kModelFile); }

  // `opaque`: the CUDA ranks' code paths on the CPU (TpGroupOptions::opaque_cpu_memory).
  static std::unique_ptr<TpGroup> MakeGroup(int tp, bool opaque = false,
                                            kernels::KvDType kv_dtype = kernels::KvDType::kF32) {
    TpGroupOptions o;
    o.tp = tp;
    o.kv_dtype = kv_dtype;
    o.opaque_cpu_memory = opaque;
    o.threads_per_rank = 1;
    o.kv_bytes_per_rank = 8ll << 20;
    auto g = TpGroup::Create(*model_, o);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? std::move(*g) : nullptr;
  }

  // Greedy generation of `max_tokens` after `prompt` on `seq`.
  static absl::StatusOr<offline::GenerateResult> Greedy(TpGroup& group, offline::Sequence& seq,
                                                        const std::string& prompt, int max_tokens) {
    offline::GenerateOptions o;
    o.sampling.temperature = 0.0f;
    o.max_tokens = max_tokens;
    o.prefill_chunk = 64;
    return offline::Generate(seq, group.backend(0), model_->config, *tok_,
                             tok_->Encode(prompt, true), o);
  }

  static inline model::Model* model_ = nullptr;
  static inline model::Tokenizer* tok_ = nullptr;
};

}  // namespace recall::runtime::tp
