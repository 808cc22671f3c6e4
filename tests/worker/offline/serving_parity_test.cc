// The offline path (Generate on a LocalSequence: `recall generate` and the quality
// benchmarks) and the serving path (the Scheduler: what `recall serve` runs) give the same
// tokens and the same evictions for the same prompt and cache settings, so what the
// benchmarks measure is what users get. Both take their evictor from the one CacheFactory.
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "tests/common/stories260k.h"
#include "worker/model/chat_template.h"
#include "worker/offline/generator.h"
#include "worker/runtime/engine.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_collect.h"

namespace recall::offline {
namespace {

struct Case {
  const char* policy;
  int budget;
  int window;
  int prompt_repeats = 1;  // the prompt text this many times (past the context: > 10)
  int max_tokens = 160;
  bool penalties = false;  // frequency_penalty 0.7 and presence_penalty 0.4 on both paths
};

class ServingParityTest : public testing::Stories260KTest,
                          public ::testing::WithParamInterface<Case> {};

TEST_P(ServingParityTest, GenerateAndTheSchedulerGiveTheSameTokensAndEvictions) {
  if (model_ == nullptr) return;
  const Case& c = GetParam();
  SCOPED_TRACE(c.policy);
  std::string text;
  for (int i = 0; i < c.prompt_repeats; ++i) {
    text += "Once upon a time, there was a little girl named Lily who loved ";
  }
  const int kMaxTokens = c.max_tokens;
  serving::CacheDefaults defaults;
  defaults.policy = c.policy;
  defaults.budget_tokens = c.budget;
  defaults.window = c.window;

  // Offline: the settings through the cache factory, as `recall generate` does.
  runtime::EngineOptions eo;
  eo.threads = 1;
  eo.kv_cache_bytes = int64_t{8} << 20;
  auto offline_engine = runtime::Engine::Create(*model_, eo);
  ASSERT_TRUE(offline_engine.ok()) << offline_engine.status();
  auto factory =
      serving::CacheFactory::Create(defaults, model_->config, model_->config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  // The session's seed as the scheduler derives it (VaSE samples with it).
  auto spec = factory->Resolve({}, std::hash<std::string>()("parity"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  GenerateOptions go;
  go.max_tokens = kMaxTokens;
  go.sampling.temperature = 0;
  go.stop_token_ids = {2};
  if (c.penalties) {
    go.sampling.frequency_penalty = 0.7f;
    go.sampling.presence_penalty = 0.4f;
  }
  go.eviction = spec->evictor;
  go.positions = spec->positions;
  go.prefill_chunk = 64;
  auto rendered = model::RenderChat(model::ChatFormat::kPlain, {{"user", text}}, true);
  ASSERT_TRUE(rendered.ok());
  const std::vector<int32_t> prompt = tok_->Encode(*rendered, true);
  auto offline = Generate((*offline_engine)->forward(0), (*offline_engine)->pool(0), *tok_, prompt,
                          go, nullptr);
  ASSERT_TRUE(offline.ok()) << offline.status();

  // Serving: a scheduler with those settings as its defaults, one session, one turn.
  auto serving_engine = runtime::Engine::Create(*model_, eo);
  ASSERT_TRUE(serving_engine.ok()) << serving_engine.status();
  serving::SchedulerOptions so;
  so.cache = defaults;
  so.limits.max_tokens = 4096;
  so.stop_token_ids = {2};
  so.chat_format = model::ChatFormat::kPlain;
  auto scheduler = serving::Scheduler::Create(**serving_engine, *tok_, so);
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  serving::TurnRequest turn;
  turn.session_id = "parity";
  turn.messages = {{"user", text}};
  turn.sampling = go.sampling;
  turn.max_tokens = kMaxTokens;
  auto stream = (*scheduler)->Submit(std::move(turn));
  ASSERT_TRUE(stream.ok()) << stream.status();
  const serving::Collected served = serving::CollectTurn(**stream);
  ASSERT_TRUE(served.status.ok()) << served.status;

  EXPECT_EQ(served.summary.prompt_tokens, static_cast<int>(prompt.size()));
  EXPECT_EQ(served.token_ids, offline->tokens);
  EXPECT_EQ(served.summary.evictions, offline->evictions);
  EXPECT_EQ(served.summary.evicted_tokens, offline->evicted_slots);
  EXPECT_EQ(served.summary.peak_kv_bytes, offline->peak_kv_bytes);
  EXPECT_EQ(served.summary.kv_bytes, offline->final_kv_bytes);
  if (c.prompt_repeats > 1) {
    EXPECT_GT(static_cast<int>(prompt.size()), model_->config.max_seq_len);
    EXPECT_GT(offline->tokens.size(), 100u) << "the reply should run on";
  }
  if (c.penalties) {  // the penalties changed the reply (else this case proves nothing)
    GenerateOptions plain = go;
    plain.sampling.frequency_penalty = plain.sampling.presence_penalty = 0;
    auto unpenalized = Generate((*offline_engine)->forward(0), (*offline_engine)->pool(0), *tok_,
                                prompt, plain, nullptr);
    ASSERT_TRUE(unpenalized.ok()) << unpenalized.status();
    EXPECT_NE(unpenalized->tokens, offline->tokens);
  }
  if (std::string(c.policy) != "full") {
    EXPECT_GT(offline->evictions, 0) << "the case should evict";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, ServingParityTest,
                         ::testing::Values(Case{"full", 1024, 32}, Case{"lazy", 48, 16},
                                           Case{"h2o", 48, 16}, Case{"tova", 48, 16},
                                           Case{"streaming", 48, 16}, Case{"vase", 48, 16},
                                           // Past the context: a 900-token prompt fed within
                                           // the bound, 1200 tokens generated, re-positioned.
                                           Case{"lazy", 48, 16, 60, 1200},
                                           Case{"h2o", 48, 16, 60, 1200},
                                           Case{"lazy", 48, 16, 1, 160, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.policy) +
                                  (info.param.prompt_repeats > 1 ? "_endless" : "") +
                                  (info.param.penalties ? "_penalties" : "");
                         });

}  // namespace
}  // namespace recall::offline
