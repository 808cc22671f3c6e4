// EpiCache quality benchmark on stories260K (EVICTION.md sections 2 and 6): conversations of
// several short stories, then a query that restarts one of them (its first sentence).
// Compares, at the same per-sequence budget C, EpiCache (episodic-model, episodic-tfidf)
// against lazy, snapkv, h2o and streaming, all against FullKV:
//   - agreement of the greedy continuation with FullKV's: tokens before the first
//     divergence, and the positional match rate over the first --match-tokens tokens;
//   - teacher-forced along FullKV's continuation: KL(full || method), top-1 agreement, and
//     the probability of the restarted story's names where FullKV says them (the main
//     character, named in the query too, and the companion, named only in the story);
//   - free-running: share of continuations naming the story's own characters, and naming
//     another story's (wrong story);
//   - cost: EpiCache's embed + build time and its build peak KV against a one-shot prefill of
//     the same prompt; device KV bytes per method.
// Prints the tables (also to --out-txt), writes --out-json and --out-png (gnuplot). With
// --details 1 the JSON also holds every run's continuation and EpiCache's per-episode checks
// (routing, each story's share of every episode's kept slots).
//
// usage: recall_episodic_bench [--model PATH] [--tokenizer PATH] [--conversations N]
//   [--stories K] [--seed S] [--methods LIST] [--budgets 64,96,128] [--window W] [--alpha A]
//   [--sinks S] [--episodes E] [--block-tokens B] [--recent R] [--max-new N]
//   [--match-tokens M] [--threads T] [--separator space|bos] [--verbose 0|1] [--details 0|1]
//   [--out-json PATH] [--out-png PATH]
//   [--out-txt PATH]
// Methods: full, episodic-model, episodic-tfidf (with -r<R> to override --recent, e.g.
// episodic-model-r0), or any decode/prefill policy name (lazy, snapkv, h2o, streaming, ...).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/quality/episodic_eval.h"
#include "bench/quality/episodic_report.h"
#include "bench/quality/report.h"
#include "bench/quality/story_set.h"
#include "cache/block_pool.h"
#include "common/clock.h"
#include "kernels/backend.h"
#include "worker/model/loader.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  std::string model =
      std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/stories260K.bin";
  std::string tokenizer = std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/tok512.bin";
  int conversations = 24;
  int stories = 4;
  uint64_t seed = 1;
  std::vector<std::string> methods = {"full", "episodic-model", "episodic-tfidf", "lazy", "snapkv",
                                      "h2o",  "streaming"};
  std::vector<int> budgets = {64, 96, 128};
  EvalSettings settings;
  int recent = 4;
  int match_tokens = 32;
  int threads = 1;
  std::string separator = "space";
  bool verbose = false;
  bool details = false;
  std::string out_json = "episodic_stories260K.json";
  std::string out_png = "episodic_stories260K.png";
  std::string out_txt;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  const auto flag = [&](const std::string& name, const char* v) -> std::optional<bool> {
    EvalSettings& s = f->settings;
    const auto positive = [&](int* out, int min) {
      return absl::SimpleAtoi(v, out) && *out >= min;
    };
    bool ok = true;
    if (name == "--model") {
      f->model = v;
    } else if (name == "--tokenizer") {
      f->tokenizer = v;
    } else if (name == "--conversations") {
      ok = positive(&f->conversations, 1);
    } else if (name == "--stories") {
      ok = positive(&f->stories, 2);
    } else if (name == "--seed") {
      ok = absl::SimpleAtoi(v, &f->seed);
    } else if (name == "--methods") {
      f->methods = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else if (name == "--budgets") {
      f->budgets.clear();
      for (absl::string_view b : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int c = 0;
        ok = ok && absl::SimpleAtoi(b, &c) && c >= 1;
        f->budgets.push_back(c);
      }
    } else if (name == "--window") {
      ok = positive(&s.window, 1);
    } else if (name == "--alpha") {
      ok = absl::SimpleAtof(v, &s.alpha);
    } else if (name == "--sinks") {
      ok = positive(&s.sinks, 0);
    } else if (name == "--episodes") {
      ok = positive(&s.episodes, 1);
    } else if (name == "--block-tokens") {
      ok = positive(&s.block_tokens, 2);
    } else if (name == "--recent") {
      ok = positive(&f->recent, 0);
    } else if (name == "--max-new") {
      ok = positive(&s.max_new, 1);
    } else if (name == "--match-tokens") {
      ok = positive(&f->match_tokens, 1);
    } else if (name == "--threads") {
      ok = positive(&f->threads, 0);
    } else if (name == "--separator") {
      f->separator = v;
    } else if (name == "--verbose") {
      f->verbose = std::string(v) == "1";
    } else if (name == "--details") {
      f->details = std::string(v) == "1";
    } else if (name == "--out-json") {
      f->out_json = v;
    } else if (name == "--out-png") {
      f->out_png = v;
    } else if (name == "--out-txt") {
      f->out_txt = v;
    } else {
      return std::nullopt;
    }
    return ok;
  };
  if (!ParseFlagPairs(argc, argv, flag, "")) return false;
  if (f->methods.empty() || f->budgets.empty()) {
    std::fprintf(stderr, "--methods and --budgets must not be empty\n");
    return false;
  }
  f->match_tokens = std::min(f->match_tokens, f->settings.max_new);
  return true;
}

constexpr char kUsage[] =
    R"U(usage: recall_episodic_bench [--model PATH] [--tokenizer PATH] [--conversations N]
  [--stories K] [--seed S] [--methods LIST] [--budgets LIST] [--window W] [--alpha A]
  [--sinks S] [--episodes E] [--block-tokens B] [--recent R] [--max-new N]
  [--match-tokens M] [--threads T] [--separator space|bos] [--verbose 0|1] [--details 0|1]
  [--out-json PATH] [--out-png PATH] [--out-txt PATH]

EpiCache against eviction policies on stories260K: conversations of several short stories,
then a query that restarts one of them; every method at the same budget C against FullKV
(greedy agreement, teacher-forced KL and top-1, the story's names, the cost). Prints the
tables, writes --out-json and --out-png (gnuplot). Every flag takes a value.

options:
)U" RECALL_BENCH_STORIES_FLAGS_HELP R"U(  --conversations N       conversations (default 24)
  --stories K             stories per conversation, at least 2 (default 4)
  --seed S                (default 1)
  --methods LIST          full, episodic-model, episodic-tfidf (-rR sets their --recent, e.g.
                          episodic-model-r0), or a policy name (lazy, snapkv, h2o, ...)
                          (default full,episodic-model,episodic-tfidf,lazy,snapkv,h2o,streaming)
  --budgets LIST          budgets C in tokens per layer and KV head (default 64,96,128)
  --window W              eviction window (default 16)
  --alpha A               LazyEviction's importance threshold (default 1e-4)
  --sinks S               sink tokens always kept (default 4)
  --episodes E            episodic: episodes (default 4)
  --block-tokens B        episodic: tokens per block of the build, at least 2 (default 128)
  --recent R              episodic: sentences before the query kept uncompressed (default 4)
  --max-new N             tokens generated per continuation (default 48)
  --match-tokens M        the match rate's tokens, at most --max-new (default 32)
  --threads T             CPU threads, 0: all cores (default 1)
  --separator KIND        space (one text after one BOS; default) or bos (BOS before every
                          story and before the query)
  --verbose 0|1           print every continuation (default 0)
  --details 0|1           put every run's continuation and EpiCache's per-episode checks in
                          the JSON (default 0)
  --out-json PATH         (default episodic_stories260K.json)
  --out-png PATH          (default episodic_stories260K.png)
  --out-txt PATH          a copy of the tables (default: none)
  -h, --help              print this and exit
)U";

int Main(int argc, char** argv) {
  if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  // The outputs are checked before the run, not after it.
  if (!OutputPathsWritable({{"--out-json", f.out_json}, {"--out-png", f.out_png}}) ||
      (!f.out_txt.empty() && !OutputPathsWritable({{"--out-txt", f.out_txt}}))) {
    return 2;
  }
  if (int rc = CheckStories260K(f.model, f.tokenizer, RECALL_SHARED_DIR_DEFAULT); rc >= 0) {
    return rc;
  }
  std::vector<Method> methods;
  for (const std::string& label : f.methods) {
    auto m = ParseMethod(label, f.recent);
    if (!m.ok()) return Fail(m.status());
    if (m->kind != "full") methods.push_back(*m);
  }
  auto model = model::LoadModel(f.model);
  if (!model.ok()) return Fail(model.status());
  const model::ModelConfig& mc = (*model)->config;
  auto tokenizer = model::LoadTokenizer(f.tokenizer, mc.vocab_size);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const model::Tokenizer& tok = **tokenizer;
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({f.threads});
  constexpr int kBlockTokens = 16;
  const kernels::PagedKvLayout layout{mc.n_layers, mc.n_kv_heads, mc.head_dim, kBlockTokens};
  // One sequence lives at a time (EpiCache: one episode on the device plus one being built).
  auto pool =
      cache::BlockPool::Create(layout, mc.n_layers * 4 * (mc.max_seq_len / kBlockTokens + 2));
  if (!pool.ok()) return Fail(pool.status());
  runtime::ForwardPass forward(**model, *backend, {mc.max_seq_len});

  ConversationOptions co;
  co.count = f.conversations;
  co.stories = f.stories;
  co.seed = f.seed;
  const std::vector<Conversation> convs = MakeConversations(co);
  std::vector<StoryPrompt> prompts;
  for (const Conversation& c : convs) {
    auto p = PreparePrompt(c, tok, f.separator);
    if (!p.ok()) return Fail(p.status());
    if (static_cast<int>(p->tokens.size()) + f.settings.max_new > mc.max_seq_len) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("a prompt of ", p->tokens.size(), " tokens + ", f.settings.max_new,
                       " new exceeds the context ", mc.max_seq_len, ": use fewer --stories")));
    }
    // The story's own text is teacher-forced after the prompt: keep what fits the context.
    const size_t room = static_cast<size_t>(mc.max_seq_len) - p->tokens.size();
    if (p->original.size() > room) {
      p->original.resize(room);
      const auto trim = [&](std::vector<int>& at, size_t n) {
        at.erase(std::remove_if(at.begin(), at.end(),
                                [&](int pos) { return static_cast<size_t>(pos) + n > room; }),
                 at.end());
      };
      trim(p->original_name_at, p->name_ids.size());
      trim(p->original_companion_at, p->companion_ids.size());
    }
    prompts.push_back(*std::move(p));
  }

  Report report(f.budgets, methods, f.settings, f.recent, f.match_tokens, f.details);
  Stopwatch total;
  for (size_t ci = 0; ci < convs.size(); ++ci) {
    const StoryPrompt& p = prompts[ci];
    auto ref = RunReference(forward, **pool, tok, p, f.settings.max_new);
    if (!ref.ok()) {
      return Fail(absl::Status(ref.status().code(), absl::StrCat("full, conversation ", ci, ": ",
                                                                 ref.status().message())));
    }
    ConversationResult cr;
    cr.conversation = &convs[ci];
    cr.prompt = &p;
    cr.reference = *ref;
    for (size_t i = 0; i < ref->tokens.size(); ++i) {
      cr.reference_logp.push_back(ref->logp[i][static_cast<size_t>(ref->tokens[i])]);
    }
    if (f.verbose) {
      std::printf("[%zu] target %d (%s/%s), %zu prompt tokens\n  full: %s\n", ci, p.target,
                  p.name.c_str(), p.companion.c_str(), p.tokens.size(), ref->text.c_str());
    }
    for (int budget : f.budgets) {
      EvalSettings s = f.settings;
      s.budget = budget;
      for (const Method& m : methods) {
        auto run = RunMethod(forward, **pool, tok, p, *ref, m, s);
        if (!run.ok()) {
          return Fail(absl::Status(run.status().code(),
                                   absl::StrCat(m.label, " C=", budget, " conversation ", ci, ": ",
                                                run.status().message())));
        }
        if (f.verbose) {
          std::printf("  %-18s C=%-3d active=%d: %s\n", m.label.c_str(), budget, run->active,
                      run->text.c_str());
        }
        cr.runs.push_back({m.label, budget, *std::move(run)});
      }
    }
    report.Add(std::move(cr));
  }
  const double seconds = total.ElapsedSeconds();

  std::string table = absl::StrFormat(
      "model %s: %d layers, %d/%d heads, context %d; %zu conversations of %d stories "
      "(prompt %d-%d tokens, seed %llu); greedy %d new tokens; W=%d alpha=%g sinks=%d; "
      "episodic E=%d block_tokens=%d recent=%d; threads %d; %.1f s\n\n",
      f.model, mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.max_seq_len, convs.size(), f.stories,
      report.min_prompt_tokens(), report.max_prompt_tokens(),
      static_cast<unsigned long long>(f.seed), f.settings.max_new, f.settings.window,
      f.settings.alpha, f.settings.sinks, f.settings.episodes, f.settings.block_tokens, f.recent,
      f.threads, seconds);
  absl::StrAppend(&table, report.Table());
  std::fputs(table.c_str(), stdout);
  if (!f.out_txt.empty()) {
    std::ofstream out(f.out_txt);
    out << table;
    if (!out) return Fail(absl::DataLossError(absl::StrCat(f.out_txt, ": write failed")));
    std::printf("wrote %s\n", f.out_txt.c_str());
  }
  nlohmann::json json = report.Json();
  json["settings"]["model"] = f.model;
  json["settings"]["tokenizer"] = f.tokenizer;
  json["settings"]["seed"] = f.seed;
  json["settings"]["threads"] = f.threads;
  json["settings"]["separator"] = f.separator;
  json["settings"]["conversations"] = convs.size();
  json["settings"]["stories_per_conversation"] = f.stories;
  json["settings"]["seconds"] = seconds;
  absl::Status st = WriteJson(f.out_json, json);
  if (!st.ok()) return Fail(st);
  std::printf("wrote %s\n", f.out_json.c_str());
  st = report.WritePlot(f.out_png, absl::StrCat("Episodic compression vs eviction at equal budget: "
                                                "stories260K, ",
                                                convs.size(), " conversations of ", f.stories,
                                                " stories, query restarts one"));
  return ReportPlot(st, f.out_png);
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
