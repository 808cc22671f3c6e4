// The worker's options spine: every recall-worker flag parses into WorkerOptions and renders
// back to the same flags (how `recall serve` forwards them), the rules between flags are
// declared once, and errors of the engine and the cache factory, which know only option
// fields, come out naming the flags.
#include "worker/service/worker_options.h"

#include <fstream>
#include <map>

#include "common/files.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"
#include "worker/serving/calibration.h"

namespace recall::service {
namespace {

// A value each flag accepts and that differs from its default.
const std::map<std::string, std::vector<std::string>> kValues = {
    {"model", {"m.bin"}},
    {"tokenizer", {"t.bin"}},
    {"random-weights", {}},
    {"dtype", {"f16"}},
    {"weight-dtype", {"int8"}},
    {"chat-format", {"chatml"}},
    {"listen", {"0.0.0.0:1"}},
    {"metrics-port", {"9"}},
    {"port-file", {"p"}},
    {"coordinator", {"c:1"}},
    {"advertise", {"a:1"}},
    {"served-model-name", {"tiny-stories"}},
    {"cluster-token-file", {"k"}},
    {"max-tokens-limit", {"7"}},
    {"calibration", {"cal.json"}},
    {"device", {"cuda"}},
    {"tp", {"2"}},
    {"devices", {"0,1"}},
    {"tp-comm", {"staged"}},
    {"threads", {"3"}},
    {"no-batch-invariant", {}},
    {"no-cuda-graphs", {}},
    {"kv-cache-bytes", {"1048576"}},
    {"kv-dtype", {"int8"}},
    {"kv-cache-fraction", {"0.5"}},
    {"max-batch-tokens", {"128"}},
    {"prefill-chunk", {"32"}},
    {"max-active", {"5"}},
    {"max-queued", {"6"}},
    {"shutdown-grace", {"7.5"}},
    {"host-cache-bytes", {"1024"}},
    {"policy", {"lazy"}},
    {"budget", {"64"}},
    {"budget-frac", {"0.5"}},
    {"window", {"16"}},
    {"alpha", {"0.001"}},
    {"tp-eviction", {"shared"}},
    {"episodes", {"3"}},
    {"embedder", {"tfidf"}},
    {"block-tokens", {"512"}},
    {"recluster-turns", {"2"}},
    {"layer-budgets", {"pyramid"}},
    {"layer-alpha", {"1.5"}},
    {"value-protection", {"0.25"}},
    {"meta-score", {"caote"}},
    {"alpha-uniform", {"3"}},
    {"attention-weight", {"0.5"}},
    {"attention-decay", {"0.8"}},
    {"tp-verify", {}},
    {"positions", {"original"}},
};

TEST(WorkerOptionsTest, EveryFlagRendersBackToItself) {
  const auto& flags = WorkerFlags();
  std::set<std::string> covered;
  for (const auto& f : flags.flags()) {
    SCOPED_TRACE(f.name);
    const auto it = kValues.find(f.name);
    ASSERT_NE(it, kValues.end()) << "no test value for --" << f.name;
    std::vector<std::string> argv = {"--" + f.name};
    argv.insert(argv.end(), it->second.begin(), it->second.end());
    WorkerOptions o;
    ASSERT_TRUE(flags.Parse(argv, &o).ok()) << flags.Parse(argv, &o);
    EXPECT_EQ(flags.Render(o), argv);
    covered.insert(f.name);
  }
  EXPECT_EQ(covered.size(), kValues.size());
}

TEST(WorkerOptionsTest, AllFlagsTogetherSurviveARoundTrip) {
  std::vector<std::string> argv;
  for (const auto& [name, value] : kValues) {
    if (name == "budget") continue;  // exclusive with --budget-frac, tested below
    argv.push_back("--" + name);
    argv.insert(argv.end(), value.begin(), value.end());
  }
  WorkerOptions a, b;
  ASSERT_TRUE(WorkerFlags().Parse(argv, &a).ok()) << WorkerFlags().Parse(argv, &a);
  const std::vector<std::string> rendered = WorkerFlags().Render(a);
  ASSERT_TRUE(WorkerFlags().Parse(rendered, &b).ok());
  EXPECT_EQ(WorkerFlags().Render(b), rendered);
  EXPECT_EQ(b.engine.device, runtime::Device::kCuda);
  EXPECT_EQ(b.engine.tp_comm, runtime::TpComm::kStaged);
  EXPECT_FALSE(b.engine.forward.batch_invariant);
  EXPECT_EQ(b.scheduler.max_active, 5);
  EXPECT_EQ(b.scheduler.cache.layer_budgets, "pyramid");
  EXPECT_EQ(b.cache.embedder, "tfidf");
}

TEST(WorkerOptionsTest, TheBudgetRuleIsTheFlagTablesOwn) {
  WorkerOptions o;
  EXPECT_EQ(WorkerFlags().Parse({"--budget", "8", "--budget-frac", "0.5"}, &o).message(),
            "--budget and --budget-frac are exclusive; give one");
  // A budget in tokens given after a default fraction replaces it.
  serving::CacheDefaults d;
  d.budget_fraction = 0.5;
  serving::CacheRequest r;
  r.budget_tokens = 8;
  EXPECT_FALSE(d.With(r).budget_fraction.has_value());
  EXPECT_EQ(d.With(r).budget_tokens, 8);
}

TEST(WorkerOptionsTest, EngineAndCacheErrorsNameTheFlags) {
  const auto& flags = WorkerFlags();
  runtime::EngineOptions e;
  e.devices = {0, 1};
  e.tp = 2;
  EXPECT_EQ(flags.Explain(e.Validate()).message(), "--devices: only with --device cuda");
  e.device = runtime::Device::kCuda;
  e.devices = {0};
  EXPECT_EQ(flags.Explain(e.Validate()).message(),
            "--devices: 1 devices for --tp 2; give one per rank");
  EXPECT_EQ(e.Validate().message(), "devices: 1 devices for tp 2; give one per rank");

  const model::ModelConfig config = testing::TinyModelConfig(2, 512);
  serving::CacheDefaults d;
  d.policy = "episodic";
  d.budget_fraction = 0.5;
  // Episodic takes a fraction too: of the context length, in tokens.
  const absl::Status st = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1).status();
  EXPECT_TRUE(st.ok()) << st;
  d = {};
  d.layer_budgets = "/nonexistent/profile.json";
  const absl::Status profile =
      serving::CacheFactory::Create(d, config, config.n_kv_heads, 1).status();
  EXPECT_EQ(profile.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(flags.Explain(profile).message().rfind("--layer-budgets: ", 0), 0u) << profile;
}

TEST(WorkerOptionsTest, ABudgetBelowWhatThePolicyAlwaysKeepsIsRefusedNotRaised) {
  const model::ModelConfig config = testing::TinyModelConfig(2, 512);
  serving::CacheDefaults d;
  d.policy = "lazy+";
  d.window = 32;
  d.budget_tokens = 16;
  const absl::Status st = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkerFlags().Explain(st).message(),
            "--budget: 16 is below the 32 tokens per layer and KV head that lazy+ always keeps "
            "(its window W; a smaller window lowers it): give a budget of at least 32")
      << st;
  // A session asking for it is refused by the field's name; the worker's defaults stand.
  d.budget_tokens = 64;
  auto factory = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  serving::CacheRequest r;
  r.policy = "streaming";
  r.budget_tokens = 4;  // sinks (4) + 1 is streaming's smallest
  const absl::Status session = factory->Resolve(r, 1).status();
  EXPECT_EQ(session.message(),
            "cache.budget_tokens: 4 is below the 5 tokens per layer and KV head that streaming "
            "always keeps (its sinks and one recent token): give a budget of at least 5");
  r.budget_tokens = 5;
  EXPECT_TRUE(factory->Resolve(r, 1).ok());
  r.budget_tokens = 4;
  r.window = 2;
  r.policy = "lazy";  // its smallest budget is its window
  EXPECT_TRUE(factory->Resolve(r, 1).ok());
  // A window past the worker's default budget names the window, which the session set (it
  // named cache.budget_tokens, which it had not).
  serving::CacheRequest wide;
  wide.policy = "lazy";
  wide.window = 100;
  EXPECT_EQ(factory->Resolve(wide, 1).status().message(),
            "cache.window: 100 needs a larger budget: the worker's default budget_tokens 64 is "
            "below the 100 tokens per layer and KV head that lazy always keeps (its window W; a "
            "smaller window lowers it): give a budget of at least 100, or a smaller window");
}

// An episodic session's block is cut to what the context leaves beside the budget (the
// default 2048 on a 512-token model failed every episode build); a budget that leaves no
// block of 16 is refused naming it.
TEST(WorkerOptionsTest, AnEpisodicBlockIsCutToFitTheContextBesideTheBudget) {
  model::ModelConfig config = testing::TinyModelConfig(2, 64);
  config.max_seq_len = 512;
  serving::CacheDefaults d;
  d.policy = "episodic";
  d.budget_tokens = 48;
  auto factory = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto spec = factory->Resolve(serving::CacheRequest(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->block_tokens, 512 - 48);
  serving::CacheRequest small;
  small.block_tokens = 96;
  EXPECT_EQ(factory->Resolve(small, 1)->block_tokens, 96);
  serving::CacheRequest huge;
  huge.budget_tokens = 500;  // its decoding (lazy, window 32) past the context does not fit
  EXPECT_EQ(factory->Resolve(huge, 1).status().message().substr(0, 40),
            "cache.budget_tokens: 500 leaves no room ");
  huge.window = 8;
  huge.budget_tokens = 500;  // fits past the context, but leaves an episode's build no block
  EXPECT_EQ(factory->Resolve(huge, 1).status().message(),
            "cache.budget_tokens: an episode's budget of 500 tokens leaves no block of 16 in the "
            "context length 512");
}

// A compact session whose budget, with its policy's lag and one step, does not fit the context
// would stop there: refused when it is made, naming the largest budget that fits. The
// built-in default budget (1024) on a smaller model is lowered to that instead.
TEST(WorkerOptionsTest, ABudgetThatLeavesNoRoomPastTheContextIsRefusedNamingTheLargestThatFits) {
  const model::ModelConfig config = testing::TinyModelConfig(2, 512);
  serving::CacheDefaults d;
  d.policy = "lazy";
  d.window = 32;
  d.budget_tokens = 480;
  const absl::Status st = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1).status();
  EXPECT_EQ(WorkerFlags().Explain(st).message(),
            "--budget: 480 leaves no room to go on past the model's context length (512): a "
            "session there keeps its budget in each layer and grows 32 more before lazy evicts "
            "(its window), so it would fill the context and stop; give at most 479 (or positions "
            "original, which ends the session at the context)")
      << st;
  d.budget_tokens = 479;
  auto factory = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  serving::CacheRequest r;
  r.policy = "h2o";  // evicts at every step: its budget may reach the context less one
  r.budget_tokens = 511;
  EXPECT_TRUE(factory->Resolve(r, 1).ok());
  r.budget_tokens.reset();
  r.budget_fraction = 0.999;
  EXPECT_EQ(factory->Resolve(r, 1).status().message().substr(0, 80),
            "cache.budget_fraction: 0.999 leaves no room to go on past the model's context le");
  EXPECT_NE(factory->Resolve(r, 1).status().message().find("give at most 0.998"),
            std::string::npos);
  r.positions = "original";  // ends at the context: any budget
  EXPECT_TRUE(factory->Resolve(r, 1).ok());
  // An episode set decodes with lazy: a budget below its window is refused (every build
  // failed), by the fraction when it was given as one.
  serving::CacheRequest episodic;
  episodic.policy = "episodic";
  episodic.budget_fraction = 0.01;
  EXPECT_EQ(factory->Resolve(episodic, 1).status().message(),
            "cache.budget_fraction: 0.01 (5 tokens of the context length) is below the 32 tokens "
            "per layer and KV head that lazy always keeps (its window W; a smaller window lowers "
            "it): give a budget of at least 32");
  // Episode settings for a session of another policy are refused (they were dropped).
  serving::CacheRequest stray;
  stray.episodes = 3;
  EXPECT_EQ(factory->Resolve(stray, 1).status().message(),
            "cache.episodes: a setting of episodic sessions only; this session's policy is lazy "
            "(the worker's default)");
  stray.episodes.reset();
  stray.policy = "h2o";
  stray.embedder = "tfidf";
  EXPECT_EQ(factory->Resolve(stray, 1).status().message(),
            "cache.embedder: a setting of episodic sessions only; this session's policy is h2o");
  stray.policy = "episodic";
  stray.budget_tokens = 64;
  EXPECT_TRUE(factory->Resolve(stray, 1).ok()) << factory->Resolve(stray, 1).status();
  // The built-in default, not given: lowered to the largest that fits.
  serving::CacheDefaults built_in;
  built_in.policy = "lazy";
  auto lowered = serving::CacheFactory::Create(built_in, config, config.n_kv_heads, 1);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->defaults().budget_tokens, 479);
  // The same value given (--budget 1024): refused, naming the largest that fits (it was
  // lowered as if not given).
  serving::CacheRequest given;
  given.budget_tokens = 1024;
  const absl::Status chosen =
      serving::CacheFactory::Create(built_in.With(given), config, config.n_kv_heads, 1).status();
  EXPECT_EQ(WorkerFlags().Explain(chosen).message().substr(0, 48),
            "--budget: 1024 leaves no room to go on past the ")
      << chosen;
  EXPECT_NE(chosen.message().find("give at most 479"), std::string::npos) << chosen;
  // A worker keeping every token by default (policy full, budget 1024 unused): a session
  // choosing lazy without a budget gets that default lowered to fit (it was refused naming
  // cache.budget_tokens, which it had not given); one giving the budget is held to it.
  auto full = serving::CacheFactory::Create(serving::CacheDefaults(), config, config.n_kv_heads, 1);
  ASSERT_TRUE(full.ok()) << full.status();
  serving::CacheRequest lazy;
  lazy.policy = "lazy";
  auto fitted = full->Resolve(lazy, 1);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_EQ(fitted->evictor->budget.budget, 479);
  lazy.budget_tokens = 1024;
  EXPECT_EQ(full->Resolve(lazy, 1).status().message().substr(0, 40),
            "cache.budget_tokens: 1024 leaves no room");
  // A fraction below the window is raised to the window by the evictor (reserved): the check
  // counts the raised budget (0.1 of 512 is 52, but lazy keeps 300, then grows 300 more).
  lazy.budget_tokens.reset();
  lazy.budget_fraction = 0.1;
  lazy.window = 300;
  EXPECT_EQ(full->Resolve(lazy, 1).status().message().substr(0, 42),
            "cache.budget_fraction: 0.1 leaves no room ");
}

TEST(WorkerOptionsTest, CaoteRescoresThePoliciesWithAnAttentionEstimateOnCpuRanks) {
  const model::ModelConfig config = testing::TinyModelConfig(2, 512);
  WorkerOptions o;
  ASSERT_TRUE(WorkerFlags()
                  .Parse({"--policy", "lazy+", "--budget", "32", "--meta-score", "caote"}, &o)
                  .ok());
  ASSERT_TRUE(ResolveWorkerOptions(&o).ok());
  auto factory = serving::CacheFactory::Create(o.scheduler.cache, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  using M = cache::eviction::PolicyOptions::MetaScore;
  auto spec = factory->Resolve(serving::CacheRequest(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->evictor->policy.meta_score, M::kCaote);
  // A session choosing a policy without an attention estimate keeps its own ranking.
  serving::CacheRequest r;
  r.policy = "streaming";
  spec = factory->Resolve(r, 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->evictor->policy.meta_score, M::kNone);
  // A worker whose own default cannot take it, or on GPU ranks, does not start.
  serving::CacheDefaults d = o.scheduler.cache;
  d.policy = "streaming";
  EXPECT_EQ(WorkerFlags()
                .Explain(serving::CacheFactory::Create(d, config, config.n_kv_heads, 1).status())
                .message(),
            "--meta-score: caote ranks by an attention estimate: h2o, tova, lazy, lazy+ or snapkv, "
            "not streaming");
  WorkerOptions gpu;
  ASSERT_TRUE(WorkerFlags()
                  .Parse({"--policy", "lazy+", "--meta-score", "caote", "--device", "cuda"}, &gpu)
                  .ok());
  EXPECT_EQ(ResolveWorkerOptions(&gpu).message(),
            "--meta-score: caote reads the cached values on the host; CPU ranks only (drop "
            "--device cuda or --meta-score)");
  WorkerOptions bad;
  EXPECT_FALSE(WorkerFlags().Parse({"--meta-score", "caote-query"}, &bad).ok());

  // --alpha-uniform: lazy+'s; sessions of other policies keep their alpha.
  d = o.scheduler.cache;
  d.meta_score = "none";
  d.alpha_uniform = 3;
  factory = serving::CacheFactory::Create(d, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  spec = factory->Resolve(serving::CacheRequest(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->evictor->policy.alpha_uniform, 3.0f);
  r.policy = "lazy";
  spec = factory->Resolve(r, 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->evictor->policy.alpha_uniform, 0.0f);
  d.policy = "lazy";
  EXPECT_EQ(WorkerFlags()
                .Explain(serving::CacheFactory::Create(d, config, config.n_kv_heads, 1).status())
                .message(),
            "--alpha-uniform: a threshold of lazy+ only, not of lazy (--policy)");

  // lazy+'s attention term: defaults, flags, and the range named by the flag.
  WorkerOptions att;
  ASSERT_TRUE(WorkerFlags().Parse({"--policy", "lazy+", "--budget", "64"}, &att).ok());
  ASSERT_TRUE(ResolveWorkerOptions(&att).ok());
  factory = serving::CacheFactory::Create(att.scheduler.cache, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  spec = factory->Resolve(serving::CacheRequest(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->evictor->policy.attention_weight, 3.0f);
  EXPECT_EQ(spec->evictor->policy.attention_decay, 0.9f);
  WorkerOptions att2;
  ASSERT_TRUE(WorkerFlags()
                  .Parse({"--policy", "lazy+", "--budget", "64", "--attention-weight", "0",
                          "--attention-decay", "0.5"},
                         &att2)
                  .ok());
  ASSERT_TRUE(ResolveWorkerOptions(&att2).ok());
  factory = serving::CacheFactory::Create(att2.scheduler.cache, config, config.n_kv_heads, 1);
  ASSERT_TRUE(factory.ok()) << factory.status();
  spec = factory->Resolve(serving::CacheRequest(), 1);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->evictor->policy.attention_weight, 0.0f);
  EXPECT_EQ(spec->evictor->policy.attention_decay, 0.5f);
  const absl::Status decay = WorkerFlags().Parse({"--attention-decay", "1"}, &bad);
  EXPECT_FALSE(decay.ok());
  EXPECT_NE(decay.message().find("--attention-decay"), absl::string_view::npos) << decay;
  EXPECT_FALSE(WorkerFlags().Parse({"--attention-weight", "-1"}, &bad).ok());
}

TEST(WorkerOptionsTest, ResolveAppliesTheSessionDefaultsAndTheForwardCapacity) {
  WorkerOptions o;
  ASSERT_TRUE(WorkerFlags()
                  .Parse({"--policy", "lazy", "--budget-frac", "0.3", "--max-batch-tokens", "100",
                          "--prefill-chunk", "50"},
                         &o)
                  .ok());
  ASSERT_TRUE(ResolveWorkerOptions(&o).ok());
  EXPECT_EQ(o.scheduler.cache.policy, "lazy");
  EXPECT_EQ(o.scheduler.cache.budget_fraction, 0.3);
  EXPECT_EQ(o.engine.forward.max_batch_tokens, 100);
  WorkerOptions bad;
  ASSERT_TRUE(WorkerFlags().Parse({"--policy", "episodic", "--tp", "2"}, &bad).ok());
  EXPECT_NE(ResolveWorkerOptions(&bad).message().find("--policy episodic: runs on one CPU rank"),
            std::string::npos);
  EXPECT_TRUE(CheckServedModelName("").ok());
  EXPECT_TRUE(CheckServedModelName("meta-llama/Llama-3.1-8B-Instruct").ok());
  EXPECT_EQ(CheckServedModelName("a\tb").message(),
            "--served-model-name: \"a\\tb\" has a space, a control character, a quote or a "
            "backslash");
  EXPECT_EQ(CheckServedModelName(std::string(257, 'x')).message(),
            "--served-model-name: at most 256 bytes, got 257");
  WorkerOptions chunk;
  EXPECT_EQ(
      WorkerFlags().Parse({"--max-batch-tokens", "16", "--prefill-chunk", "64"}, &chunk).message(),
      "--prefill-chunk: 64 is more than --max-batch-tokens (16)");
  WorkerOptions active;
  EXPECT_EQ(
      WorkerFlags().Parse({"--max-batch-tokens", "32", "--prefill-chunk", "16"}, &active).message(),
      "--max-active: 64 running turns decode up to 64 tokens a step, more than "
      "--max-batch-tokens (32); lower --max-active or raise --max-batch-tokens");
  EXPECT_TRUE(
      WorkerFlags()
          .Parse({"--max-batch-tokens", "32", "--prefill-chunk", "16", "--max-active", "32"},
                 &active)
          .ok());
}

// Budget flags beside policy full (the default) do nothing: they are named for a warning;
// beside a policy that evicts, or where a calibration makes the default evict, they are not.
TEST(WorkerOptionsTest, BudgetFlagsThatPolicyFullIgnoresAreNamed) {
  const auto ignored = [](const std::vector<std::string>& args) {
    WorkerOptions o;
    EXPECT_TRUE(WorkerFlags().Parse(args, &o).ok());
    EXPECT_TRUE(ResolveWorkerOptions(&o).ok());
    return IgnoredBudgetFlags(o.cache, o.scheduler.cache);
  };
  EXPECT_EQ(ignored({"--budget", "64", "--layer-budgets", "pyramid"}), "--budget, --layer-budgets");
  EXPECT_EQ(ignored({"--policy", "full", "--budget-frac", "0.3", "--window", "8"}),
            "--budget-frac, --window");
  EXPECT_EQ(ignored({"--policy", "lazy", "--budget", "64", "--layer-budgets", "pyramid"}), "");
  EXPECT_EQ(ignored({}), "");
}

// A calibration file (`recall calibrate-window --out`) sets the policy, budget fraction,
// window and alpha defaults; the flags beside it win; a missing or broken file is an error
// naming the flag and the file, never a crash.
TEST(WorkerOptionsTest, ACalibrationFileSetsTheSessionDefaultsUnlessTheFlagsDo) {
  const std::string dir = testing::MakeTempDir("calibration");
  const std::string good = dir + "/cal.json";
  ASSERT_TRUE(WriteFileWhole("calibration", good,
                             serving::EvictionCalibrationJson({"lazy+", 0.2, 48, 0.03}))
                  .ok());
  WorkerOptions o;
  ASSERT_TRUE(WorkerFlags().Parse({"--calibration", good}, &o).ok());
  ASSERT_TRUE(ResolveWorkerOptions(&o).ok());
  EXPECT_EQ(o.scheduler.cache.policy, "lazy+");
  ASSERT_TRUE(o.scheduler.cache.budget_fraction.has_value());
  EXPECT_EQ(*o.scheduler.cache.budget_fraction, 0.2);
  EXPECT_EQ(o.scheduler.cache.window, 48);
  EXPECT_EQ(o.scheduler.cache.alpha, 0.03);
  WorkerOptions flags_win;
  ASSERT_TRUE(WorkerFlags()
                  .Parse({"--calibration", good, "--window", "16", "--alpha", "0.001", "--policy",
                          "streaming", "--budget", "64"},
                         &flags_win)
                  .ok());
  ASSERT_TRUE(ResolveWorkerOptions(&flags_win).ok());
  EXPECT_EQ(flags_win.scheduler.cache.window, 16);
  EXPECT_EQ(flags_win.scheduler.cache.alpha, 0.001);
  EXPECT_EQ(flags_win.scheduler.cache.policy, "streaming");
  EXPECT_FALSE(flags_win.scheduler.cache.budget_fraction.has_value());
  EXPECT_EQ(flags_win.scheduler.cache.budget_tokens, 64);

  // lazy+'s relative threshold, value protection and meta score from the file; a --policy
  // beside it keeps the file's lazy+ settings off its sessions.
  serving::EvictionCalibration full_cal{"lazy+", 0.2, 32, 0.03};
  full_cal.alpha_uniform = 3;
  full_cal.value_protection = 0.1;
  full_cal.meta_score = "caote";
  full_cal.layer_budgets = "pyramid";
  const std::string full_file = dir + "/full.json";
  ASSERT_TRUE(
      WriteFileWhole("calibration", full_file, serving::EvictionCalibrationJson(full_cal)).ok());
  WorkerOptions all;
  ASSERT_TRUE(WorkerFlags().Parse({"--calibration", full_file}, &all).ok());
  ASSERT_TRUE(ResolveWorkerOptions(&all).ok());
  EXPECT_EQ(all.scheduler.cache.alpha_uniform, 3);
  EXPECT_EQ(all.scheduler.cache.value_protection, 0.1);
  EXPECT_EQ(all.scheduler.cache.meta_score, "caote");
  EXPECT_EQ(all.scheduler.cache.layer_budgets, "pyramid");
  // A profile named relative to the calibration file is found beside it.
  serving::EvictionCalibration rel_cal = full_cal;
  rel_cal.layer_budgets = "model.sensitivity.json";
  ASSERT_TRUE(
      WriteFileWhole("calibration", dir + "/rel.json", serving::EvictionCalibrationJson(rel_cal))
          .ok());
  std::ofstream(dir + "/model.sensitivity.json") << "{}";  // read (and checked) at start
  absl::StatusOr<serving::EvictionCalibration> rel =
      serving::ReadEvictionCalibration(dir + "/rel.json");
  ASSERT_TRUE(rel.ok()) << rel.status();
  EXPECT_EQ(rel->layer_budgets, dir + "/model.sensitivity.json");
  WorkerOptions other;
  ASSERT_TRUE(
      WorkerFlags()
          .Parse({"--calibration", full_file, "--policy", "streaming", "--value-protection", "0.3"},
                 &other)
          .ok());
  ASSERT_TRUE(ResolveWorkerOptions(&other).ok());
  EXPECT_EQ(other.scheduler.cache.alpha_uniform, 0);
  EXPECT_EQ(other.scheduler.cache.meta_score, "none");
  EXPECT_EQ(other.scheduler.cache.value_protection, 0.3);
  // A GPU worker takes the file's policy and thresholds, not what reads values on the host.
  WorkerOptions gpu;
  ASSERT_TRUE(WorkerFlags().Parse({"--calibration", full_file, "--device", "cuda"}, &gpu).ok());
  ASSERT_TRUE(ResolveWorkerOptions(&gpu).ok());
  EXPECT_EQ(gpu.scheduler.cache.policy, "lazy+");
  EXPECT_EQ(gpu.scheduler.cache.alpha_uniform, 3);
  EXPECT_EQ(gpu.scheduler.cache.value_protection, 0);
  EXPECT_EQ(gpu.scheduler.cache.meta_score, "none");
  ASSERT_TRUE(WorkerFlags().Parse({"--device", "cuda", "--value-protection", "0.2"}, &gpu).ok());
  EXPECT_EQ(ResolveWorkerOptions(&gpu).message(),
            "--value-protection: reads the cached values on the host; CPU ranks only (drop "
            "--device cuda or --value-protection)");

  const std::vector<std::pair<std::string, std::string>> broken = {
      {"", "not valid JSON"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 0, "
       "\"alpha\": 0.1}",
       "\"window\" must be an integer"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": \"x\"}",
       "\"alpha\" must be a number in (0, 1)"},
      {"{\"format\": \"recall-layer-sensitivity\"}", "\"format\" must be"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"policy\": \"full\"}",
       "\"policy\" must be an evicting policy (streaming, "},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"budget_fraction\": 1.5}",
       "\"budget_fraction\" must be a number in (0, 1]"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"meta_score\": \"caote-query\"}",
       "\"meta_score\" must be \"none\" or \"caote\""},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"value_protection\": 1}",
       "\"value_protection\" must be a number in [0, 1)"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"layer_budgets\": 3}",
       "\"layer_budgets\" must be uniform, pyramid or a profile's path"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"alpha_uniform\": -2}",
       "\"alpha_uniform\" must be a number in [0, 1e6]"},
      {"[1, 2", "not valid JSON"},
      {"{\"alpha\": ", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{\"format\": \"recall-eviction-calibration\", \"version\": 1, \"window\": 8, "
       "\"alpha\": 0.1, \"layer_budgets\": \"/nope/profile.json\"}",
       "\"layer_budgets\": cannot read the profile (/nope/profile.json: no such file or "
       "directory"},
  };
  for (const auto& [text, message] : broken) {
    const std::string path = dir + "/broken.json";
    {
      std::ofstream f(path);
      f << text;
    }
    WorkerOptions b;
    ASSERT_TRUE(WorkerFlags().Parse({"--calibration", path}, &b).ok());
    const absl::Status st = ResolveWorkerOptions(&b);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(st.message().rfind("--calibration: " + path + ": ", 0), 0u) << st;
    EXPECT_NE(st.message().find(message), std::string::npos) << st;
  }
  WorkerOptions missing;
  ASSERT_TRUE(WorkerFlags().Parse({"--calibration", dir + "/none.json"}, &missing).ok());
  EXPECT_EQ(ResolveWorkerOptions(&missing).code(), absl::StatusCode::kNotFound);
}

// The session cache flags' help gives the defaults they stand in for (a worker's; none where
// they are another process's, as in `recall chat`).
TEST(WorkerOptionsTest, TheSessionCacheHelpGivesTheDefaults) {
  const std::string help = WorkerFlags().Help();
  for (const char* line :
       {"KV budget in tokens per layer and KV head (default 1024)",
        "(EpiCache, one CPU rank: --budget in tokens) (default full)",
        "importance threshold (default 0.0001)", "(default 32)", "(default uniform)",
        "at most (default 4)", "or tfidf (default model)"}) {
    EXPECT_NE(help.find(line), std::string::npos) << line << "\n" << help;
  }
  serving::CacheDefaults generate;
  generate.budget_tokens = 256;
  EXPECT_NE(SessionCacheFlags(&generate).Help().find("head (default 256)"), std::string::npos);
  EXPECT_EQ(SessionCacheFlags().Help().find("(default"), std::string::npos);
}

}  // namespace
}  // namespace recall::service
