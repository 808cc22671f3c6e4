// KV-eviction quality benchmark (EVICTION.md section 6) on the real stories260K model:
// every policy at every budget against FullKV on texts the model samples itself.
//   - teacher-forced KL(full || evicted) and top-1 agreement after the first eviction;
//   - free-running greedy: tokens until the first divergence from FullKV;
//   - recall probes: probability of a name stated early and repeated late;
//   - the KV memory actually held (peak and final bytes) against the full cache.
// With --kv-dtypes (f32,bf16,f16,int8; default f32) every configuration also runs on a pool
// of each KV type, judged against the fp32 FullKV reference of the same texts (the first
// type listed must be f32).
// Prints a table, writes every figure and the settings to --out-json and a plot to --out-png
// (with gnuplot; without it a warning, the JSON is still written).
//
// usage: recall_quality_bench [--model PATH] [--tokenizer PATH] [--texts N]
//   [--policies full,streaming,h2o,tova,lazy] [--budgets 0.2,0.3,0.5,0.7] [--window W]
//   [--alpha A] [--calibration FILE] [--layer-budgets uniform|pyramid|PROFILE] [--layer-alpha A]
//   [--value-protection F] [--alpha-uniform K] [--tp-eviction uniform|shared|head-adaptive]
//   [--meta-score none|caote|caote-query] [--merge SIM] [--merge-keys on|off]
//   [--attention-decay G] [--attention-weight B]
//   [--sinks S] [--prefix N] [--greedy-prefix N] [--probe-early N]
//   [--probe-late N] [--seed S] [--heldout-seed S2] [--peaks 0.15,0.2,0.3]
//   [--threads N] [--kv-dtypes f32,bf16,int8] [--out-json PATH] [--out-png PATH]
// Besides the per-budget table it prints every policy at equal PEAK memory (equal_peak.h) on
// the texts of --seed and, beside them, on a held-out set sampled with --heldout-seed (0: no
// held-out set), and with several KV types, every (policy, type) at the bytes it holds as a
// fraction of the f32 FullKV's bytes (a 16-bit type holds twice the tokens in equal bytes).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/quality/equal_peak.h"
#include "bench/quality/eval_set.h"
#include "bench/quality/quality_eval.h"
#include "bench/quality/report.h"
#include "cache/block_pool.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/model/loader.h"
#include "worker/runtime/forward.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/calibration.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  std::string model = std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/stories260K.bin";
  std::string tokenizer = std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/tok512.bin";
  int texts = 16;
  std::vector<std::string> policies = {"full", "streaming", "h2o", "tova", "lazy"};
  std::vector<double> budgets = {0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7};
  std::vector<double> peaks = {0.15, 0.2, 0.3, 0.4, 0.5};
  // Without --window/--alpha: what `recall serve` resolves for a session (CacheDefaults, or
  // the window, alpha(s), value protection and meta score of --calibration FILE, as
  // `recall serve --calibration FILE`).
  int window = serving::CacheDefaults().window;
  double alpha = serving::CacheDefaults().alpha;
  std::string calibration;
  std::string layer_budgets = "uniform";  // uniform, pyramid or a profile (recall calibrate)
  double layer_alpha = 1.2;
  double value_protection = 0;
  double alpha_uniform = 0;
  std::string tp_eviction = "uniform";
  std::string meta_score = "none";
  double merge_similarity = 2;  // <= 1: merge evicted tokens (--merge SIM)
  bool merge_keys = false;
  // lazy+'s attention term (PolicyOptions; weight 0: the recurrence score alone).
  double attention_decay = cache::eviction::PolicyOptions().attention_decay;
  double attention_weight = cache::eviction::PolicyOptions().attention_weight;
  bool window_given = false, alpha_given = false;
  int sinks = 4;
  int prefix = 16;
  int greedy_prefix = 384;
  int probe_early = 100;
  int probe_late = 350;
  uint64_t seed = 1;
  uint64_t heldout_seed = 2;
  int threads = 0;
  std::vector<std::string> kv_dtypes = {"f32"};
  std::string out_json = "quality_stories260K.json";
  std::string out_png = "quality_stories260K.png";
};

bool ParseInt(const char* s, int* out) { return absl::SimpleAtoi(s, out); }

std::optional<kernels::KvDType> ParseKvDType(const std::string& name) {
  for (const kernels::KvDType t : {kernels::KvDType::kF32, kernels::KvDType::kBF16,
                                   kernels::KvDType::kF16, kernels::KvDType::kInt8}) {
    if (name == kernels::KvDTypeName(t)) return t;
  }
  return std::nullopt;
}

std::optional<cache::eviction::PolicyOptions::MetaScore> MetaScoreFromName(const std::string& n) {
  using M = cache::eviction::PolicyOptions::MetaScore;
  if (n == "none") return M::kNone;
  if (n == "caote") return M::kCaote;
  if (n == "caote-query") return M::kCaoteCurrentQuery;
  return std::nullopt;
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  const auto flag = [&](const std::string& name, const char* v) -> std::optional<bool> {
    bool ok = true;
    if (name == "--model") f->model = v;
    else if (name == "--tokenizer") f->tokenizer = v;
    else if (name == "--texts") ok = ParseInt(v, &f->texts) && f->texts >= 1;
    else if (name == "--policies") f->policies = absl::StrSplit(v, ',', absl::SkipEmpty());
    else if (name == "--budgets") {
      f->budgets.clear();
      for (absl::string_view b : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        double x = 0;
        ok = ok && absl::SimpleAtod(b, &x) && x > 0 && x <= 1;
        f->budgets.push_back(x);
      }
    } else if (name == "--peaks") {
      f->peaks.clear();
      for (absl::string_view b : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        double x = 0;
        ok = ok && absl::SimpleAtod(b, &x) && x > 0 && x <= 1;
        f->peaks.push_back(x);
      }
    } else if (name == "--window") {
      ok = ParseInt(v, &f->window);
      f->window_given = true;
    } else if (name == "--alpha") {
      ok = absl::SimpleAtod(v, &f->alpha);
      f->alpha_given = true;
    } else if (name == "--calibration") {
      f->calibration = v;
    } else if (name == "--sinks") {
      ok = ParseInt(v, &f->sinks);
    } else if (name == "--layer-budgets") {
      f->layer_budgets = v;
    } else if (name == "--layer-alpha") {
      ok = absl::SimpleAtod(v, &f->layer_alpha);
    } else if (name == "--value-protection") {
      ok = absl::SimpleAtod(v, &f->value_protection);
    } else if (name == "--alpha-uniform") {
      ok = absl::SimpleAtod(v, &f->alpha_uniform) && f->alpha_uniform >= 0;
    } else if (name == "--tp-eviction") {
      f->tp_eviction = v;
    } else if (name == "--merge") {
      ok = absl::SimpleAtod(v, &f->merge_similarity) && f->merge_similarity >= -1 &&
           f->merge_similarity <= 1;
    } else if (name == "--merge-keys") {
      ok = std::strcmp(v, "on") == 0 || std::strcmp(v, "off") == 0;
      f->merge_keys = std::strcmp(v, "on") == 0;
    } else if (name == "--attention-decay") {
      ok = absl::SimpleAtod(v, &f->attention_decay) && f->attention_decay >= 0 &&
           f->attention_decay < 1;
    } else if (name == "--attention-weight") {
      ok = absl::SimpleAtod(v, &f->attention_weight) && f->attention_weight >= 0 &&
           f->attention_weight <= 1e6;
    } else if (name == "--meta-score") {
      f->meta_score = v;
      ok = MetaScoreFromName(v).has_value();
    } else if (name == "--prefix")
      ok = ParseInt(v, &f->prefix);
    else if (name == "--greedy-prefix") ok = ParseInt(v, &f->greedy_prefix);
    else if (name == "--probe-early") ok = ParseInt(v, &f->probe_early);
    else if (name == "--probe-late") ok = ParseInt(v, &f->probe_late);
    else if (name == "--seed") ok = absl::SimpleAtoi(v, &f->seed);
    else if (name == "--heldout-seed")
      ok = absl::SimpleAtoi(v, &f->heldout_seed);
    else if (name == "--threads") ok = ParseInt(v, &f->threads);
    else if (name == "--kv-dtypes") {
      f->kv_dtypes = absl::StrSplit(v, ',', absl::SkipEmpty());
      for (const std::string& t : f->kv_dtypes) ok = ok && ParseKvDType(t).has_value();
      ok = ok && !f->kv_dtypes.empty() && f->kv_dtypes[0] == "f32";
    } else if (name == "--out-json")
      f->out_json = v;
    else if (name == "--out-png") f->out_png = v;
    else {
      return std::nullopt;
    }
    return ok;
  };
  if (!ParseFlagPairs(
          argc, argv, flag,
          "budgets and peaks are fractions in (0, 1]; --kv-dtypes lists f32 (first), bf16, f16, "
          "int8; --meta-score is none, caote or caote-query; --merge takes a key similarity in "
          "[-1, 1]; --merge-keys is on or off; --attention-decay is in [0, 1), --attention-weight "
          "in [0, "
          "1e6]")) {
    return false;
  }
  if (!f->calibration.empty()) {
    absl::StatusOr<serving::EvictionCalibration> c =
        serving::ReadEvictionCalibration(f->calibration);
    if (!c.ok()) {
      std::fprintf(stderr, "--calibration: %s\n", std::string(c.status().message()).c_str());
      return false;
    }
    if (!f->window_given) f->window = c->window;
    if (!f->alpha_given) f->alpha = c->alpha;
    // As a worker takes them (worker_options.cc): the file fills what is still at its default;
    // the relative threshold is lazy+'s, and the meta score goes to the policies that take it.
    if (f->value_protection == 0) f->value_protection = c->value_protection;
    if (f->alpha_uniform == 0) f->alpha_uniform = c->alpha_uniform;
    if (f->meta_score == "none") f->meta_score = c->meta_score;
    if (f->layer_budgets == "uniform") f->layer_budgets = c->layer_budgets;
  }
  if (f->policies.empty() || f->budgets.empty()) {
    std::fprintf(stderr, "--policies and --budgets must not be empty\n");
    return false;
  }
  return true;
}

// The best row at each target peak, under an equal-peak table.
void PrintBest(const std::vector<EqualPeakRow>& rows, const std::vector<double>& peaks) {
  const std::vector<std::string> best = BestAtEachPeak(rows);
  std::printf("%-12s", "best");
  for (size_t k = 0; k < peaks.size(); ++k) {
    std::printf(" %18s", best[k].empty() ? "-" : best[k].c_str());
  }
  std::printf("\n");
}

constexpr char kUsage[] =
    R"U(usage: recall_quality_bench [--model PATH] [--tokenizer PATH] [--texts N] [options]

KV-eviction quality on stories260K: every policy at every budget against FullKV on texts the
model samples itself (teacher-forced KL and top-1 agreement after the first eviction, greedy
tokens until the first divergence, recall probes, the KV bytes held); every policy at equal
peak memory on these texts and on a held-out set; with --kv-dtypes, every configuration on a
pool of each KV type. Prints the tables, writes --out-json and --out-png (gnuplot).
Every flag takes a value.

options:
)U" RECALL_BENCH_STORIES_FLAGS_HELP R"U(  --texts N               texts (default 16)
  --policies LIST         policies, comma-separated (default full,streaming,h2o,tova,lazy)
  --budgets LIST          budgets as fractions of a text, in (0, 1]
                          (default 0.1,0.15,0.2,0.3,0.4,0.5,0.7)
  --peaks LIST            the equal-peak table's peaks, fractions of FullKV's, in (0, 1]
                          (default 0.15,0.2,0.3,0.4,0.5)
  --window W              eviction window (default: --calibration's, else 32)
  --alpha A               LazyEviction's importance threshold (default: --calibration's,
                          else 1e-4)
  --calibration FILE      a recall calibrate-window --out file: its window and alpha, and its
                          value protection, relative threshold, meta score and layer budgets
                          where those flags are at their defaults (as recall serve takes it)
  --layer-budgets SPEC    uniform (default), pyramid or a recall calibrate profile
  --layer-alpha A         the profile's exponent (default 1.2)
  --value-protection F    the budget's share kept for the largest values (default 0)
  --alpha-uniform K       lazy+: important at K times the uniform share, >= 0 (default 0: off)
  --tp-eviction MODE      uniform (default), shared or head-adaptive
  --meta-score NAME       none (default), caote or caote-query
  --merge SIM             merge evicted tokens into kept ones whose keys are at least this
                          similar (cosine, in [-1, 1]) (default: off)
  --merge-keys on|off     with --merge, merge the keys too (default off)
  --attention-decay G     lazy+: the recent attention's decay per step, in [0, 1) (default 0.9)
  --attention-weight B    lazy+: the recent attention's weight, in [0, 1e6] (default 3)
  --sinks S               sink tokens that streaming and VaSE always keep (default 4)
  --prefix N              tokens prefilled before the token-by-token teacher forcing
                          (default 16)
  --greedy-prefix N       prompt tokens of the greedy runs (default 384)
  --probe-early N         recall probes: names first stated before token N (default 100)
  --probe-late N          ...and repeated at token N or later (default 350)
  --seed S                the texts' seed (default 1)
  --heldout-seed S        the held-out texts' seed, 0: no held-out set (default 2)
  --threads N             CPU threads (default 0: all cores)
  --kv-dtypes LIST        KV types, f32 first, then bf16, f16, int8 (default f32)
  --out-json PATH         (default quality_stories260K.json)
  --out-png PATH          (default quality_stories260K.png)
  -h, --help              print this and exit
)U";

int Main(int argc, char** argv) {
  if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  // The outputs are checked before the run (minutes to hours), not after it.
  if (!OutputPathsWritable({{"--out-json", f.out_json}, {"--out-png", f.out_png}})) return 2;
  int plot_rc = 0;  // 1 when a PNG could not be written
  if (int rc = CheckStories260K(f.model, f.tokenizer, RECALL_SHARED_DIR_DEFAULT); rc >= 0) {
    return rc;
  }
  auto model = model::LoadModel(f.model);
  if (!model.ok()) return Fail(model.status());
  const model::ModelConfig& mc = (*model)->config;
  auto tokenizer = model::LoadTokenizer(f.tokenizer, mc.vocab_size);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({f.threads});

  std::vector<QualityConfig> configs;
  const int length = mc.max_seq_len;
  for (const std::string& p : f.policies) {
    for (double b : f.budgets) {
      configs.push_back({p, b, static_cast<int>(std::ceil(b * length - 1e-9))});
    }
  }
  const int k_runs = static_cast<int>(configs.size()) + 1;
  constexpr int kBlockTokens = 16;
  const int64_t pool_blocks = mc.n_layers * (k_runs * (length / kBlockTokens + 2) + 8);
  const kernels::PagedKvLayout layout{mc.n_layers, mc.n_kv_heads, mc.head_dim, kBlockTokens};
  auto pool = cache::BlockPool::Create(layout, pool_blocks);
  if (!pool.ok()) return Fail(pool.status());
  // Batch-invariant: a configuration's figures do not depend on which others share its batch.
  runtime::ForwardPass forward(
      **model, *backend,
      {.max_batch_tokens = std::max({f.prefix, f.greedy_prefix, k_runs, length}),
       .batch_invariant = true});

  Stopwatch watch;
  EvalSetOptions eo;
  eo.n_texts = f.texts;
  eo.length = length;
  eo.seed = f.seed;
  auto texts = SampleEvalSet(forward, **pool, **tokenizer, eo);
  if (!texts.ok()) return Fail(texts.status());
  const std::vector<RecallProbe> probes =
      FindRecallProbes(**tokenizer, *texts, f.probe_early, f.probe_late);
  std::printf("model %s: %d layers, %d/%d heads, context %d; %d texts of %d tokens sampled "
              "(T=%.1f, top-p %.2f) in %.1f s; %zu recall probes\n",
              f.model.c_str(), mc.n_layers, mc.n_heads, mc.n_kv_heads, length, f.texts, length,
              eo.temperature, eo.top_p, watch.ElapsedSeconds(), probes.size());

  QualityEvalOptions qo;
  qo.window = f.window;
  qo.alpha = static_cast<float>(f.alpha);
  qo.sinks = f.sinks;
  qo.layer_budgets = f.layer_budgets;
  qo.layer_alpha = f.layer_alpha;
  qo.value_protection = f.value_protection;
  qo.alpha_uniform = f.alpha_uniform;
  qo.tp_eviction = f.tp_eviction;
  qo.meta_score = *MetaScoreFromName(f.meta_score);
  qo.merge_similarity = f.merge_similarity;
  qo.merge_keys = f.merge_keys;
  qo.attention_decay = static_cast<float>(f.attention_decay);
  qo.attention_weight = static_cast<float>(f.attention_weight);
  qo.prefix = f.prefix;
  qo.greedy_prefix = f.greedy_prefix;
  // Every configuration on every text of `set`, on a pool of each of `types` (the first f32:
  // its pass records the FullKV reference of each text that the other types are judged
  // against).
  const auto evaluate = [&](const std::vector<EvalText>& set,
                            const std::vector<RecallProbe>& set_probes,
                            const std::vector<std::string>& types,
                            std::vector<std::vector<QualityStats>>* out) -> absl::Status {
    out->assign(types.size(), std::vector<QualityStats>(configs.size()));
    std::vector<FullReference> references(set.size());
    for (size_t k = 0; k < types.size(); ++k) {
      const kernels::KvDType type = *ParseKvDType(types[k]);
      std::unique_ptr<cache::BlockPool> typed;
      cache::BlockPool* use = pool->get();
      if (type != kernels::KvDType::kF32) {
        kernels::PagedKvLayout tl = layout;
        tl.dtype = type;
        RECALL_ASSIGN_OR_RETURN(typed, cache::BlockPool::Create(tl, pool_blocks));
        use = typed.get();
      }
      for (size_t t = 0; t < set.size(); ++t) {
        std::vector<RecallProbe> mine;
        for (const RecallProbe& p : set_probes) {
          if (p.text == static_cast<int>(t)) mine.push_back(p);
        }
        QualityEvalOptions to = qo;
        if (k == 0) {
          to.record = &references[t];
        } else {
          to.reference = &references[t];
        }
        RECALL_RETURN_IF_ERROR(EvaluateText(forward, *use, set[t], mine, configs, to, &(*out)[k]));
      }
    }
    return absl::OkStatus();
  };
  std::vector<std::vector<QualityStats>> stats_by_type;
  watch.Reset();
  if (absl::Status s = evaluate(*texts, probes, f.kv_dtypes, &stats_by_type); !s.ok()) {
    return Fail(s);
  }
  // The held-out text set, on every KV type too, for the equal-peak comparison.
  std::vector<std::vector<QualityStats>> heldout;
  if (f.heldout_seed != 0) {
    EvalSetOptions ho = eo;
    ho.seed = f.heldout_seed;
    auto held_texts = SampleEvalSet(forward, **pool, **tokenizer, ho);
    if (!held_texts.ok()) return Fail(held_texts.status());
    const std::vector<RecallProbe> held_probes =
        FindRecallProbes(**tokenizer, *held_texts, f.probe_early, f.probe_late);
    if (absl::Status s = evaluate(*held_texts, held_probes, f.kv_dtypes, &heldout); !s.ok()) {
      return Fail(s);
    }
  }
  const std::vector<QualityStats>& stats = stats_by_type[0];
  const double eval_seconds = watch.ElapsedSeconds();
  std::printf(
      "evaluated %zu configurations x %zu KV types%s in %.1f s (W=%d, alpha=%g, sinks=%d, "
      "prefix=%d, greedy prefix=%d%s)\n\n",
      configs.size(), f.kv_dtypes.size(), f.heldout_seed != 0 ? " (and on the held-out texts)" : "",
      eval_seconds, f.window, f.alpha, f.sinks, f.prefix, f.greedy_prefix,
      absl::StrCat(
          f.alpha_uniform > 0 ? absl::StrCat(", lazy+ alpha-uniform=", f.alpha_uniform) : "",
          f.value_protection > 0 ? absl::StrCat(", value protection=", f.value_protection) : "",
          f.meta_score != "none" ? absl::StrCat(", meta score=", f.meta_score) : "",
          absl::StrCat(", lazy+ attention decay=", f.attention_decay,
                       " weight=", f.attention_weight),
          f.merge_similarity <= 1 ? absl::StrCat(", merge at similarity ", f.merge_similarity,
                                                 f.merge_keys ? " (keys too)" : "")
                                  : "")
          .c_str());
  for (size_t k = 0; k < f.kv_dtypes.size(); ++k) {
    if (f.kv_dtypes.size() > 1) {
      std::printf("KV type %s%s:\n", f.kv_dtypes[k].c_str(),
                  k == 0 ? "" : " (against the fp32 FullKV reference)");
    }
    PrintTable(configs, stats_by_type[k]);
    if (f.kv_dtypes.size() > 1) std::printf("\n");
  }
  std::printf(
      "\nKL: mean KL(full || evicted) in nats and top1: top-1 agreement, both over "
      "the npos positions after each run's first eviction; ppl/ppl_f: perplexity of "
      "the text there, evicted/full; greedy: tokens until the first divergence from "
      "FullKV greedy / cap; recall/rec_f: mean probability of a late repeated name, "
      "evicted/full; peak/final: KV bytes held vs the full cache.\n\n");
  const std::vector<EqualPeakRow> equal = EqualPeak(configs, stats, f.peaks);
  PrintEqualPeak(absl::StrCat("texts of seed ", f.seed), equal, f.peaks);
  PrintBest(equal, f.peaks);
  std::vector<EqualPeakRow> equal_heldout;
  if (!heldout.empty()) {
    equal_heldout = EqualPeak(configs, heldout[0], f.peaks);
    std::printf("\n");
    PrintEqualPeak(absl::StrCat("held-out texts of seed ", f.heldout_seed), equal_heldout, f.peaks);
    PrintBest(equal_heldout, f.peaks);
  }
  // With several KV types: every (policy, type) at the bytes it really holds, as a fraction
  // of the fp32 FullKV's bytes (a half-width type holds twice the tokens in the same bytes).
  std::vector<EqualPeakRow> equal_bytes, equal_bytes_heldout;
  if (f.kv_dtypes.size() > 1) {
    const auto all_types = [&](const std::vector<std::vector<QualityStats>>& by_type) {
      std::vector<EqualPeakRow> rows;
      for (size_t k = 0; k < f.kv_dtypes.size(); ++k) {
        std::vector<EqualPeakRow> r =
            EqualPeak(configs, by_type[k], f.peaks, &by_type[0], absl::StrCat(" ", f.kv_dtypes[k]));
        rows.insert(rows.end(), r.begin(), r.end());
      }
      return rows;
    };
    const auto show = [&](const std::string& set, const std::vector<EqualPeakRow>& rows) {
      std::printf("\n");
      PrintEqualPeak(
          absl::StrCat(set, ", every KV type at its bytes (fractions of the f32 FullKV's)"), rows,
          f.peaks);
      PrintBest(rows, f.peaks);
    };
    equal_bytes = all_types(stats_by_type);
    show(absl::StrCat("texts of seed ", f.seed), equal_bytes);
    if (!heldout.empty()) {
      equal_bytes_heldout = all_types(heldout);
      show(absl::StrCat("held-out texts of seed ", f.heldout_seed), equal_bytes_heldout);
    }
  }
  if (!equal_bytes.empty()) {
    // The bytes view as a plot too: the held-out set's rows when there is one.
    const std::string png =
        absl::StrCat(f.out_png.size() > 4 && f.out_png.substr(f.out_png.size() - 4) == ".png"
                         ? f.out_png.substr(0, f.out_png.size() - 4)
                         : f.out_png,
                     "_bytes.png");
    const bool held = !equal_bytes_heldout.empty();
    plot_rc |=
        ReportPlot(WriteEqualPeakPlot(
                       png,
                       absl::StrCat("Every (policy, KV type) at the bytes it holds: stories260K, ",
                                    held ? "held-out texts of seed " : "texts of seed ",
                                    held ? f.heldout_seed : f.seed),
                       "peak KV bytes held (% of the f32 FullKV bytes)",
                       held ? equal_bytes_heldout : equal_bytes),
                   png);
  }

  nlohmann::json json;
  json["settings"] = {
      {"model", f.model},
      {"tokenizer", f.tokenizer},
      {"texts", f.texts},
      {"text_tokens", length},
      {"prompts", eo.prompts},
      {"seed", f.seed},
      {"temperature", eo.temperature},
      {"top_p", eo.top_p},
      {"policies", f.policies},
      {"budgets", f.budgets},
      {"budget_unit", "tokens per (layer, KV head) = ceil(fraction * text_tokens)"},
      {"window", f.window},
      {"alpha", f.alpha},
      {"sinks", f.sinks},
      {"value_protection", f.value_protection},
      {"alpha_uniform", f.alpha_uniform},
      {"tp_eviction", f.tp_eviction},
      {"meta_score", f.meta_score},
      {"merge_similarity",
       f.merge_similarity <= 1 ? nlohmann::json(f.merge_similarity) : nlohmann::json(nullptr)},
      {"merge_keys", f.merge_keys},
      {"lazy_plus_attention_decay", f.attention_decay},
      {"lazy_plus_attention_weight", f.attention_weight},
      {"teacher_forced_prefix", f.prefix},
      {"greedy_prefix", f.greedy_prefix},
      {"probe_early", f.probe_early},
      {"probe_late", f.probe_late},
      {"block_tokens", kBlockTokens},
      {"eval_seconds", eval_seconds},
  };
  nlohmann::json probe_list = nlohmann::json::array();
  for (const RecallProbe& p : probes) {
    probe_list.push_back({{"text", p.text}, {"name", p.name}, {"first", p.first},
                          {"late", p.start}, {"tokens", p.n_tokens}});
  }
  json["recall_probes"] = probe_list;
  json["results"] = ResultsJson(configs, stats);
  json["settings"]["heldout_seed"] = f.heldout_seed;
  json["settings"]["peaks"] = f.peaks;
  json["equal_peak"] = EqualPeakJson(equal, f.peaks);
  if (!heldout.empty()) {
    json["heldout_results"] = ResultsJson(configs, heldout[0]);
    json["equal_peak_heldout"] = EqualPeakJson(equal_heldout, f.peaks);
  }
  json["settings"]["kv_dtypes"] = f.kv_dtypes;
  for (size_t k = 0; k < f.kv_dtypes.size(); ++k) {
    json["results_by_kv_dtype"][f.kv_dtypes[k]] = ResultsJson(configs, stats_by_type[k]);
    if (!heldout.empty()) {
      json["heldout_results_by_kv_dtype"][f.kv_dtypes[k]] = ResultsJson(configs, heldout[k]);
    }
  }
  if (!equal_bytes.empty()) json["equal_bytes"] = EqualPeakJson(equal_bytes, f.peaks);
  if (!equal_bytes_heldout.empty()) {
    json["equal_bytes_heldout"] = EqualPeakJson(equal_bytes_heldout, f.peaks);
  }
  absl::Status s = WriteJson(f.out_json, json);
  if (!s.ok()) return Fail(s);
  std::printf("wrote %s\n", f.out_json.c_str());
  s = WritePlot(f.out_png,
                absl::StrCat("KV eviction quality vs FullKV: stories260K, ", f.texts,
                             " sampled 512-token texts, W=", f.window, ", alpha=", f.alpha),
                configs, stats);
  plot_rc |= ReportPlot(s, f.out_png);
  return plot_rc;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
