// Endless-session quality benchmark on stories260K: texts several times the model's context
// (stories the model samples itself, concatenated), teacher-forced through a compact
// (endless) cache of every policy and budget made by serving::CacheFactory as the server
// makes it, against the sliding window with recompute at equal memory (a fresh context of
// the last M tokens at every position, M the policy's peak tokens per layer and KV head).
// Reports per (policy, C) the compact cache's perplexity past the context and over all
// positions, the baseline's, and their ratio; the full cache's perplexity over the first
// context for reference. Optionally (--speed-tokens > 0) the decode step time of one long
// lazy session at two positions (run it on an otherwise idle machine: the load average is
// printed beside the figures).
//
// usage: recall_endless_bench [--model PATH] [--tokenizer PATH] [--texts N] [--tokens L]
//   [--seed S] [--policies streaming,h2o,tova,lazy,vase] [--budgets 64,128,256]
//   [--window W] [--alpha A] [--threads T] [--quality 0|1] [--slot-baseline 0|1]
//   [--speed-tokens N] [--speed-policy P] [--speed-budget C] [--out-json PATH]
//   [--out-txt PATH]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
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
#include "bench/quality/endless_eval.h"
#include "bench/quality/report.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/tensor.h"
#include "worker/model/loader.h"
#include "worker/runtime/engine.h"
#include "worker/serving/cache_factory.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  std::string model =
      std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/stories260K.bin";
  std::string tokenizer = std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/tok512.bin";
  EndlessTextOptions texts;
  std::vector<std::string> policies = {"streaming", "h2o", "tova", "lazy", "vase"};
  std::vector<int> budgets = {64, 128, 256};
  int window = 16;
  double alpha = serving::CacheDefaults().alpha;
  int threads = 1;
  bool quality = true;
  bool slot_baseline = true;
  int speed_tokens = 0;
  std::string speed_policy = "lazy";
  int speed_budget = 128;
  std::string out_json = "endless_stories260K.json";
  std::string out_txt;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  const auto flag = [&](const std::string& name, const char* v) -> std::optional<bool> {
    const auto at_least = [&](int* out, int min) {
      return absl::SimpleAtoi(v, out) && *out >= min;
    };
    const auto boolean = [&](bool* out) {
      *out = std::string(v) == "1";
      return std::string(v) == "0" || std::string(v) == "1";
    };
    bool ok = true;
    if (name == "--model") {
      f->model = v;
    } else if (name == "--tokenizer") {
      f->tokenizer = v;
    } else if (name == "--texts") {
      ok = at_least(&f->texts.n_texts, 1);
    } else if (name == "--tokens") {
      ok = at_least(&f->texts.length, 2);
    } else if (name == "--seed") {
      ok = absl::SimpleAtoi(v, &f->texts.seed);
    } else if (name == "--policies") {
      f->policies = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else if (name == "--budgets") {
      f->budgets.clear();
      for (absl::string_view b : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int c = 0;
        ok = ok && absl::SimpleAtoi(b, &c) && c >= 1;
        f->budgets.push_back(c);
      }
    } else if (name == "--window") {
      ok = at_least(&f->window, 1);
    } else if (name == "--alpha") {
      ok = absl::SimpleAtod(v, &f->alpha);
    } else if (name == "--threads") {
      ok = at_least(&f->threads, 0);
    } else if (name == "--quality") {
      ok = boolean(&f->quality);
    } else if (name == "--slot-baseline") {
      ok = boolean(&f->slot_baseline);
    } else if (name == "--speed-tokens") {
      ok = at_least(&f->speed_tokens, 0);
    } else if (name == "--speed-policy") {
      f->speed_policy = v;
    } else if (name == "--speed-budget") {
      ok = at_least(&f->speed_budget, 1);
    } else if (name == "--out-json") {
      f->out_json = v;
    } else if (name == "--out-txt") {
      f->out_txt = v;
    } else {
      return std::nullopt;
    }
    return ok;
  };
  if (!ParseFlagPairs(argc, argv, flag, "")) return false;
  if (f->quality && (f->policies.empty() || f->budgets.empty())) {
    std::fprintf(stderr, "--policies and --budgets must not be empty\n");
    return false;
  }
  return true;
}

// The three load averages of /proc/loadavg ("?" when unreadable).
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "?";
  return absl::StrCat(a, " ", b, " ", c);
}

struct ConfigResult {
  std::string policy;
  int budget = 0;
  std::vector<Nll> nll;       // per text
  int64_t peak_kv_bytes = 0;  // the largest over the texts
  int peak_slots = 0;
  int64_t evictions = 0, evicted_slots = 0;
  int compactions = 0;
  double mean_age = 0, share_old = 0;  // means over the texts
  double seconds = 0;
  int m = 0;  // peak tokens per (layer, KV head) from the peak bytes
};

// Everything printed goes through here, so that --out-txt gets the same text.
class Out {
 public:
  template <typename... Args>
  void operator()(const absl::FormatSpec<Args...>& format, const Args&... args) {
    const std::string s = absl::StrFormat(format, args...);
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
    text_ += s;
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

constexpr char kUsage[] =
    R"U(usage: recall_endless_bench [--model PATH] [--tokenizer PATH] [--texts N] [--tokens L]
  [--seed S] [--policies LIST] [--budgets LIST] [--window W] [--alpha A] [--threads T]
  [--quality 0|1] [--slot-baseline 0|1] [--speed-tokens N] [--speed-policy P]
  [--speed-budget C] [--out-json PATH] [--out-txt PATH]

Sessions past the context on stories260K: texts several times the model's context (stories
the model samples itself, concatenated), teacher-forced through a compact (endless) cache of
every policy and budget, against the sliding window with recompute at equal memory. Prints
per (policy, C) the perplexity past the context and over all positions, the baseline's and
their ratio; optionally the decode step time of one long session (--speed-tokens).
Every flag takes a value.

options:
)U" RECALL_BENCH_STORIES_FLAGS_HELP R"U(  --texts N               texts (default 6)
  --tokens L              tokens per text (default 2048; at least 2)
  --seed S                story k is sampled with seed S * 1000000 + k (default 1)
  --policies LIST         policies, comma-separated (default streaming,h2o,tova,lazy,vase)
  --budgets LIST          budgets C in tokens per layer and KV head (default 64,128,256)
  --window W              eviction window (default 16)
  --alpha A               LazyEviction's importance threshold (default 1e-4)
  --threads T             CPU threads, 0: all cores (default 1)
  --quality 0|1           run the quality part (default 1)
  --slot-baseline 0|1     also the sliding window at each policy's peak slots, its state not
                          counted (default 1)
  --speed-tokens N        time the decode steps of one session of N tokens, 0: off
                          (default 0)
  --speed-policy P        that session's policy (default lazy)
  --speed-budget C        that session's budget in tokens (default 128)
  --out-json PATH         (default endless_stories260K.json)
  --out-txt PATH          a copy of what is printed (default: none)
  -h, --help              print this and exit
)U";

int Main(int argc, char** argv) {
  if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  // The outputs are checked before the run (up to 20 minutes), not after it.
  if (!OutputPathsWritable({{"--out-json", f.out_json}}) ||
      (!f.out_txt.empty() && !OutputPathsWritable({{"--out-txt", f.out_txt}}))) {
    return 2;
  }
  if (int rc = CheckStories260K(f.model, f.tokenizer, RECALL_SHARED_DIR_DEFAULT); rc >= 0) {
    return rc;
  }
  Stopwatch run_watch;
  auto model = model::LoadModel(f.model);
  if (!model.ok()) return Fail(model.status());
  const model::ModelConfig& mc = (*model)->config;
  auto tokenizer = model::LoadTokenizer(f.tokenizer, mc.vocab_size);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const model::Tokenizer& tok = **tokenizer;
  const int context = mc.max_seq_len;

  runtime::EngineOptions eo;
  eo.threads = f.threads;
  eo.kv_cache_bytes = int64_t{64} << 20;
  // fp32 KV, as the committed results were measured (the ratio compares caches of one type).
  eo.kv_dtype = kernels::KvDType::kF32;
  auto engine = runtime::Engine::Create(**model, eo);
  if (!engine.ok()) return Fail(engine.status());
  runtime::ForwardPass& forward = (*engine)->forward(0);
  cache::BlockPool& pool = (*engine)->pool(0);
  const int block_tokens = eo.block_tokens;
  // KV bytes of one token in every layer and KV head (K and V).
  const int64_t token_bytes = pool.layout().TokenBytes();

  serving::CacheDefaults defaults;
  defaults.window = f.window;
  defaults.alpha = f.alpha;
  auto factory = serving::CacheFactory::Create(defaults, mc, mc.n_kv_heads, 1);
  if (!factory.ok()) return Fail(factory.status());
  const auto resolve = [&](const std::string& policy, int budget, uint64_t session) {
    serving::CacheRequest r;
    r.policy = policy;
    r.budget_tokens = budget;
    r.positions = "compact";
    return factory->Resolve(r, session);
  };

  Out out;
  nlohmann::json json;
  json["settings"] = {
      {"model", f.model},
      {"tokenizer", f.tokenizer},
      {"context", context},
      {"texts", f.texts.n_texts},
      {"text_tokens", f.texts.length},
      {"seed", f.texts.seed},
      {"story_seed", "seed * 1000000 + k for the k-th story over all texts"},
      {"temperature", f.texts.temperature},
      {"policies", f.policies},
      {"budgets", f.budgets},
      {"budget_unit", "tokens per (layer, KV head)"},
      {"window", f.window},
      {"alpha", f.alpha},
      {"positions", "compact"},
      {"threads", f.threads},
      {"block_tokens", block_tokens},
      {"peak_tokens",
       absl::StrCat("peak_kv_bytes (the KV blocks and the policy's per-slot state) / (n_layers * "
                    "n_kv_heads * head_dim * 2 * 4, fp32 KV) = peak_kv_bytes / ",
                    token_bytes, ": whole blocks of ", block_tokens,
                    " slots and the state, in tokens (rounded down): the baseline's M")},
  };
  out("model %s: %d layers, %d/%d heads, head_dim %d, context %d; threads %d\n", f.model,
      mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.head_dim, context, f.threads);

  if (f.quality) {
    Stopwatch watch;
    auto texts = SampleEndlessTexts(forward, pool, tok, f.texts);
    if (!texts.ok()) return Fail(texts.status());
    const double sample_seconds = watch.ElapsedSeconds();
    out("texts: %d of %d tokens (%.1fx the context), each stories sampled by the model from BOS "
        "with the full cache (temperature %.1f, no top-k/top-p) until it emits BOS or EOS or "
        "fills the context of %d tokens, concatenated (each story opens with BOS) and cut at %d "
        "tokens; story k over all texts is seeded %llu * 1000000 + k (--seed); sampled in "
        "%.1f s\n",
        f.texts.n_texts, f.texts.length, static_cast<double>(f.texts.length) / context,
        f.texts.temperature, context, f.texts.length, static_cast<unsigned long long>(f.texts.seed),
        sample_seconds);
    nlohmann::json text_json = nlohmann::json::array();
    for (size_t i = 0; i < texts->size(); ++i) {
      const EndlessText& t = (*texts)[i];
      out("  text %zu: %zu stories (seeds %llu..%llu), %d ran to the context; opens \"%s...\"\n", i,
          t.story_seeds.size(), static_cast<unsigned long long>(t.story_seeds.front()),
          static_cast<unsigned long long>(t.story_seeds.back()), t.capped,
          tok.Decode({t.tokens.begin(), t.tokens.begin() + std::min<size_t>(16, t.tokens.size())},
                     true));
      text_json.push_back({{"stories", t.story_seeds.size()},
                           {"story_seeds", t.story_seeds},
                           {"stories_to_context", t.capped},
                           {"text", tok.Decode(t.tokens, false)}});
    }
    json["texts"] = text_json;

    // The full cache over the first context.
    watch.Reset();
    std::vector<Nll> full;
    for (const EndlessText& t : *texts) {
      auto nll = FullCacheNll(forward, pool, t.tokens, context);
      if (!nll.ok()) return Fail(nll.status());
      full.push_back(*std::move(nll));
    }
    const int first_end = std::min(context, f.texts.length);
    const double ppl_full_first = Perplexity(full, 1, first_end);
    out("full cache over targets 1..%d (the first context): perplexity %.4f\n", first_end - 1,
        ppl_full_first);

    // The compact caches.
    std::vector<ConfigResult> results;
    double policy_seconds = 0;
    for (const std::string& p : f.policies) {
      for (int c : f.budgets) {
        ConfigResult r;
        r.policy = p;
        r.budget = c;
        for (size_t i = 0; i < texts->size(); ++i) {
          auto spec = resolve(p, c, f.texts.seed * 1000 + i);
          if (!spec.ok()) return Fail(spec.status());
          auto run = TeacherForceCompact(forward, pool, *spec, (*texts)[i].tokens);
          if (!run.ok()) return Fail(run.status());
          r.nll.push_back(run->nll);
          r.peak_kv_bytes = std::max(r.peak_kv_bytes, run->peak_kv_bytes);
          r.peak_slots = std::max(r.peak_slots, run->peak_slots);
          r.evictions += run->evictions;
          r.evicted_slots += run->evicted_slots;
          r.compactions += run->compactions;
          r.mean_age += run->mean_age / static_cast<double>(texts->size());
          r.share_old += run->share_older_than_context / static_cast<double>(texts->size());
          r.seconds += run->seconds;
        }
        r.m = static_cast<int>(r.peak_kv_bytes / token_bytes);
        if (r.peak_kv_bytes % token_bytes != 0) {
          // (A policy's per-slot state is in the peak, so this is the usual case for them.)
          out("note: %s C=%d: M = %d, the longest window whose KV fits the peak of %lld bytes "
              "(KV and the policy's state), rounded down\n",
              p, c, r.m, static_cast<long long>(r.peak_kv_bytes));
        }
        policy_seconds += r.seconds;
        results.push_back(std::move(r));
      }
    }
    out("compact caches: %zu configurations x %d texts teacher-forced in %.1f s\n", results.size(),
        f.texts.n_texts, policy_seconds);

    // The sliding-window baselines, one per window length.
    watch.Reset();
    std::map<int, std::vector<Nll>> baselines;
    const auto baseline = [&](int m) -> absl::StatusOr<const std::vector<Nll>*> {
      auto it = baselines.find(m);
      if (it != baselines.end()) return &it->second;
      std::vector<Nll> per_text;
      for (const EndlessText& t : *texts) {
        RECALL_ASSIGN_OR_RETURN(Nll nll, SlidingWindowNll(forward, pool, t.tokens, m));
        per_text.push_back(std::move(nll));
      }
      return &(baselines[m] = std::move(per_text));
    };
    for (const ConfigResult& r : results) {
      if (auto b = baseline(r.m); !b.ok()) return Fail(b.status());
      if (f.slot_baseline) {
        if (auto b = baseline(r.peak_slots); !b.ok()) return Fail(b.status());
      }
    }
    const double baseline_seconds = watch.ElapsedSeconds();
    std::vector<int> ms;
    for (const auto& [m, unused] : baselines) ms.push_back(m);
    out("sliding-window baselines: M = %s recomputed at every position in %.1f s\n",
        absl::StrJoin(ms, ", "), baseline_seconds);
    // A window that holds the whole prefix is the full cache: a check of the baseline.
    for (const auto& [m, per_text] : baselines) {
      double max_diff = 0;
      for (size_t i = 0; i < per_text.size(); ++i) {
        for (int t = 1; t < std::min(m + 1, first_end); ++t) {
          max_diff = std::max(max_diff, std::abs(per_text[i][t] - full[i][t]));
        }
      }
      out("  check: M=%d equals the full cache while the window holds the whole prefix (targets "
          "1..%d): max |nll diff| %.2e\n",
          m, std::min(m, first_end - 1), max_diff);
      json["baseline_checks"][std::to_string(m)] = max_diff;
    }

    const int past = context;  // targets [context, L): past the context
    const int end = f.texts.length;
    out("\nper (policy, C), W=%d, alpha=%g; ppl>ctx: perplexity over targets %d..%d (past the "
        "context), all: over targets 1..%d; base: sliding window of the last M tokens "
        "recomputed at every position, M = the policy's peak KV bytes in tokens per layer and KV "
        "head (whole blocks of %d); ratio = compact / base; age: mean age in tokens of the "
        "held slots past the context, old: their share older than the context (%d tokens)\n\n",
        f.window, f.alpha, past, end - 1, end - 1, block_tokens, context);
    out("%-9s %4s %6s %5s %5s %9s %9s %7s %9s %9s %7s", "policy", "C", "peakKB", "M", "slots",
        "ppl>ctx", "base>ctx", "ratio", "ppl_all", "base_all", "ratio");
    if (f.slot_baseline) out(" %11s", "base@slots");
    out(" %6s %6s %8s %7s\n", "age", "old", "evict", "compact");
    nlohmann::json rows = nlohmann::json::array();
    std::string ratio_lines;
    for (const ConfigResult& r : results) {
      const std::vector<Nll>& b = baselines.at(r.m);
      const double ppl_past = Perplexity(r.nll, past, end), ppl_all = Perplexity(r.nll, 1, end);
      const double base_past = Perplexity(b, past, end), base_all = Perplexity(b, 1, end);
      const double ratio_past = ppl_past / base_past, ratio_all = ppl_all / base_all;
      out("%-9s %4d %6.1f %5d %5d %9.4f %9.4f %7.4f %9.4f %9.4f %7.4f", r.policy, r.budget,
          static_cast<double>(r.peak_kv_bytes) / 1024.0, r.m, r.peak_slots, ppl_past, base_past,
          ratio_past, ppl_all, base_all, ratio_all);
      nlohmann::json row = {
          {"policy", r.policy},
          {"budget", r.budget},
          {"peak_kv_bytes", r.peak_kv_bytes},
          {"peak_tokens", r.m},
          {"peak_slots", r.peak_slots},
          {"evictions", r.evictions},
          {"evicted_slots", r.evicted_slots},
          {"compactions", r.compactions},
          {"seconds", r.seconds},
          {"ppl_past_context", ppl_past},
          {"ppl_all", ppl_all},
          {"ppl_first_context", Perplexity(r.nll, 1, first_end)},
          {"baseline_ppl_past_context", base_past},
          {"baseline_ppl_all", base_all},
          {"ratio_past_context", ratio_past},
          {"ratio_all", ratio_all},
      };
      if (f.slot_baseline) {
        const double slots_past = Perplexity(baselines.at(r.peak_slots), past, end);
        out(" %11.4f", slots_past);
        row["baseline_at_slots_ppl_past_context"] = slots_past;
        row["baseline_at_slots_ppl_all"] = Perplexity(baselines.at(r.peak_slots), 1, end);
      }
      out(" %6.1f %5.1f%% %8lld %7d\n", r.mean_age, 100 * r.share_old,
          static_cast<long long>(r.evictions), r.compactions);
      row["mean_age_past_context"] = r.mean_age;
      row["share_older_than_context"] = r.share_old;
      nlohmann::json segments = nlohmann::json::array();
      for (int from = 1; from < end; from = (from / context + 1) * context) {
        const int to = std::min(end, (from / context + 1) * context);
        segments.push_back({{"targets", absl::StrCat(from, "..", to - 1)},
                            {"ppl", Perplexity(r.nll, from, to)},
                            {"baseline_ppl", Perplexity(b, from, to)}});
      }
      row["ppl_by_segment"] = segments;
      nlohmann::json per_text = nlohmann::json::array();
      for (size_t i = 0; i < r.nll.size(); ++i) {
        per_text.push_back({{"ppl_past_context", Perplexity({r.nll[i]}, past, end)},
                            {"baseline_ppl_past_context", Perplexity({b[i]}, past, end)}});
      }
      row["per_text"] = per_text;
      rows.push_back(row);
      absl::StrAppendFormat(&ratio_lines,
                            "ratio %s C=%d M=%d: perplexity past the context %.4f / baseline "
                            "%.4f = %.4f; all positions %.4f / %.4f = %.4f\n",
                            r.policy, r.budget, r.m, ppl_past, base_past, ratio_past, ppl_all,
                            base_all, ratio_all);
    }
    out("\nfull cache, targets 1..%d: perplexity %.4f (reference)\n", first_end - 1,
        ppl_full_first);
    // Whether quality holds as the session goes on: per stretch of one context.
    out("\nperplexity per stretch of %d targets, compact / base:\n%-9s %4s", context, "policy",
        "C");
    for (int from = 1; from < end; from = (from / context + 1) * context) {
      out(" %15s", absl::StrCat(from, "..", std::min(end, (from / context + 1) * context) - 1));
    }
    out("\n");
    for (const ConfigResult& r : results) {
      out("%-9s %4d", r.policy, r.budget);
      for (int from = 1; from < end; from = (from / context + 1) * context) {
        const int to = std::min(end, (from / context + 1) * context);
        out("   %5.3f / %5.3f", Perplexity(r.nll, from, to),
            Perplexity(baselines.at(r.m), from, to));
      }
      out("\n");
    }
    out("\n%s", ratio_lines);
    json["full_cache"] = {{"targets", absl::StrCat("1..", first_end - 1)}, {"ppl", ppl_full_first}};
    json["results"] = rows;
    json["seconds"] = {{"sample_texts", sample_seconds},
                       {"compact_caches", policy_seconds},
                       {"baselines", baseline_seconds}};
  }

  if (f.speed_tokens > 0) {
    auto spec = resolve(f.speed_policy, f.speed_budget, f.texts.seed);
    if (!spec.ok()) return Fail(spec.status());
    StepTimeOptions so;
    so.tokens = f.speed_tokens;
    so.seed = f.texts.seed;
    const std::string load_before = LoadAverage();
    auto times = TimeDecodeSteps(forward, pool, *spec, tok.bos_id(), so);
    if (!times.ok()) return Fail(times.status());
    const std::string load_after = LoadAverage();
    out("\ndecode step time: one %s C=%d W=%d compact session from BOS, sampling (temperature 1, "
        "seed %llu), %d tokens, %d thread(s), in %.1f s; %d re-positionings; peak KV %lld "
        "bytes; load average (1, 5, 15 min) before %s, after %s\n",
        f.speed_policy, f.speed_budget, f.window, static_cast<unsigned long long>(so.seed),
        so.tokens, f.threads, times->seconds, times->compactions_total,
        static_cast<long long>(times->peak_kv_bytes), load_before, load_after);
    nlohmann::json windows = nlohmann::json::array();
    for (size_t c = 0; c < so.centers.size(); ++c) {
      out("  around token %d (%d steps from %d): median %.4f ms, mean %.4f ms, max %.4f ms, %d "
          "re-positionings in the window\n",
          so.centers[c], so.steps, so.centers[c] - so.steps / 2, times->median_ms[c],
          times->mean_ms[c], times->max_ms[c], times->compactions[c]);
      windows.push_back({{"center", so.centers[c]},
                         {"steps", so.steps},
                         {"median_ms", times->median_ms[c]},
                         {"mean_ms", times->mean_ms[c]},
                         {"max_ms", times->max_ms[c]},
                         {"compactions", times->compactions[c]}});
    }
    const double ratio = times->median_ms.back() / times->median_ms.front();
    out("  step time ratio (median at %d / at %d): %.3f\n", so.centers.back(), so.centers.front(),
        ratio);
    json["step_time"] = {{"policy", f.speed_policy},
                         {"budget", f.speed_budget},
                         {"tokens", so.tokens},
                         {"threads", f.threads},
                         {"seconds", times->seconds},
                         {"compactions", times->compactions_total},
                         {"peak_kv_bytes", times->peak_kv_bytes},
                         {"load_average_before", load_before},
                         {"load_average_after", load_after},
                         {"windows", windows},
                         {"ratio", ratio}};
  }

  out("\ntotal %.1f s\n", run_watch.ElapsedSeconds());
  json["seconds_total"] = run_watch.ElapsedSeconds();
  if (absl::Status s = WriteJson(f.out_json, json); !s.ok()) return Fail(s);
  std::printf("wrote %s\n", f.out_json.c_str());
  if (!f.out_txt.empty()) {
    std::ofstream txt(f.out_txt);
    txt << out.text();
    if (!txt) return Fail(absl::InternalError("cannot write " + f.out_txt));
    std::printf("wrote %s\n", f.out_txt.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
