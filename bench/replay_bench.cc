// What an exact rebuild (worker/serving/replay.h) costs against the plain prefill of the
// transcript it replaces, measured in the same run: a conversation of --turns turns with a
// lazy cache (budget --budget, window 16) is built on a real Scheduler; then its last turn is
// rebuilt twice from the transcript, once replaying the replies' tokens as decode steps and
// once prefilling the rendered text, and the time to the rebuilt turn's first token is
// taken for each (best of --rounds). Models: stories260K (real weights, from ../shared) and
// SmolLM2-135M's shape with random bf16 weights and stories260K's 512-token vocabulary.
//
// usage: recall_replay_bench [--turns N] [--reply-tokens N] [--budget N] [--rounds N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "bench/bench_util.h"
#include "bench/shapes.h"
#include "common/clock.h"
#include "common/flags.h"
#include "kernels/backend.h"
#include "worker/model/loader.h"
#include "worker/model/random_model.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_collect.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  int turns = 8;
  int reply_tokens = 48;
  int budget = 96;
  int rounds = 3;
};

const flags::FlagSet<Flags>& ReplayFlags() {
  static const flags::FlagSet<Flags> f = [] {
    flags::FlagSet<Flags> s;
    s.Int(
         "turns", "N", "turns of the conversation (default 8; at least 2)",
         [](auto& o) -> auto& { return o.turns; }, 2, 100000)
        .Int(
            "reply-tokens", "N", "tokens of each reply (default 48; at least 2)",
            [](auto& o) -> auto& { return o.reply_tokens; }, 2, 100000)
        .Int(
            "budget", "N", "the lazy cache's budget in tokens (default 96; at least 16)",
            [](auto& o) -> auto& { return o.budget; }, 16, 1 << 24)
        .Int(
            "rounds", "N", "rebuilds of each kind, the best kept (default 3; at least 1)",
            [](auto& o) -> auto& { return o.rounds; }, 1, 100000);
    return s;
  }();
  return f;
}

const char* const kUser[] = {"Once upon a time",   "What happened next?",
                             "Who was there?",     "Then the dog ran to the park.",
                             "What did Lily say?", "And then?"};

serving::TurnRequest Turn(const std::string& id, int i, int history, const Flags& f) {
  serving::TurnRequest r;
  r.session_id = id;
  r.messages = {{"user", kUser[i % 6]}};
  r.history_length = history;
  r.sampling.temperature = 0;
  r.max_tokens = f.reply_tokens;
  r.cache.policy = "lazy";
  r.cache.budget_tokens = f.budget;
  r.cache.window = 16;
  r.cache.positions = "compact";
  return r;
}

int Run(const std::string& name, const model::Model& model, const model::Tokenizer& tok,
        const Flags& f) {
  auto backend = kernels::CreateCpuBackend({0});
  const model::ModelConfig& c = model.config;
  auto pool =
      cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16, kernels::KvDType::kBF16},
                               int64_t{c.n_layers} * 512);
  if (!pool.ok())
    return std::fprintf(stderr, "%s\n", std::string(pool.status().message()).c_str()), 1;
  serving::SchedulerOptions o;
  o.stop_token_ids = {};  // replies run to their length: every turn the same size
  auto sched = serving::Scheduler::Create(model, *backend, **pool, tok, o);
  if (!sched.ok())
    return std::fprintf(stderr, "%s\n", std::string(sched.status().message()).c_str()), 1;
  // The conversation, kept.
  std::vector<model::ChatMessage> history;
  std::vector<std::optional<serving::ReplyRecord>> replies;
  for (int i = 0; i + 1 < f.turns; ++i) {
    auto stream = (*sched)->Submit(Turn("conv", i, static_cast<int>(history.size()), f));
    if (!stream.ok())
      return std::fprintf(stderr, "%s\n", std::string(stream.status().message()).c_str()), 1;
    serving::Collected r = serving::CollectTurn(**stream);
    if (!r.status.ok())
      return std::fprintf(stderr, "%s\n", std::string(r.status.message()).c_str()), 1;
    history.push_back({"user", kUser[i % 6]});
    history.push_back({"assistant", r.summary.text});
    replies.emplace_back();
    replies.push_back(serving::ReplyRecord{r.token_ids, r.summary.finish});
  }
  // The last turn rebuilt, timed to its first token.
  auto rebuild = [&](bool replay, int* prompt_tokens) {
    (*sched)->DropSession("conv").IgnoreError();
    serving::TurnRequest r = Turn("conv", f.turns - 1, static_cast<int>(history.size()), f);
    r.max_tokens = 1;
    r.history = history;
    if (replay) r.history_replies = replies;
    Stopwatch w;
    auto stream = (*sched)->Submit(std::move(r));
    serving::Collected got = serving::CollectTurn(**stream);
    const double s = w.ElapsedSeconds();
    *prompt_tokens = got.summary.prompt_tokens;
    return got.status.ok() ? s : -1.0;
  };
  double best_replay = 1e9, best_text = 1e9;
  int replay_tokens = 0, text_tokens = 0;
  for (int round = 0; round < f.rounds; ++round) {
    best_replay = std::min(best_replay, rebuild(true, &replay_tokens));
    best_text = std::min(best_text, rebuild(false, &text_tokens));
  }
  if (best_replay < 0 || best_text < 0) return std::fprintf(stderr, "a rebuild failed\n"), 1;
  std::printf(
      "%-28s %5d turns, %5d / %5d tokens: replay %8.1f ms, prefill %8.1f ms, "
      "replay / prefill %.2fx\n",
      name.c_str(), f.turns, replay_tokens, text_tokens, best_replay * 1e3, best_text * 1e3,
      best_replay / best_text);
  return 0;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_replay_bench [--turns N] [--reply-tokens N] [--budget N] [--rounds N]

What an exact rebuild costs against a plain prefill of the same transcript: a conversation
with a lazy cache (window 16) is built on a real scheduler, then its last turn is rebuilt
twice from the transcript, once replaying the replies' tokens as decode steps and once
prefilling the rendered text; prints the time to the rebuilt turn's first token of each.
Models: stories260K from
)U" RECALL_SHARED_DIR_DEFAULT
    R"U(/models/stories260K (skipped when missing)
and SmolLM2-135M's shape with random bf16 weights and stories260K's vocabulary.

options:
)U";

int Main(int argc, char** argv) {
  Flags f;
  if (int rc = ParseBenchFlags(argc, argv, "recall_replay_bench", kUsageHead, ReplayFlags(), &f);
      rc >= 0) {
    return rc;
  }
  const std::string dir = std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/";
  std::error_code ec;
  if (!std::filesystem::exists(dir + "tok512.bin", ec) ||
      !std::filesystem::exists(dir + "stories260K.bin", ec)) {
    std::printf("SKIP: stories260K not found under %s\n", dir.c_str());
    return 0;
  }
  auto tok = model::LoadTokenizer(dir + "tok512.bin", 512);
  auto model = model::LoadModel(dir + "stories260K.bin");
  if (!tok.ok() || !model.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string((tok.ok() ? model.status() : tok.status()).message()).c_str());
    return 1;
  }
  std::printf(
      "time to the first token of a rebuilt last turn (lazy, budget %d, window 16, "
      "replies of %d tokens; best of %d)\n",
      f.budget, f.reply_tokens, f.rounds);
  if (int rc = Run("stories260K", **model, **tok, f)) return rc;
  model::ModelConfig shape = NamedShape("smollm2-135m");
  shape.vocab_size = 512;
  shape.max_seq_len = 8192;
  auto random = model::MakeRandomModel(shape, kernels::DType::kBF16, 1);
  if (!random.ok())
    return std::fprintf(stderr, "%s\n", std::string(random.status().message()).c_str()), 1;
  return Run("SmolLM2-135M shape (random)", **random, **tok, f);
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
