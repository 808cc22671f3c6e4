#include "cli/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/model/load.h"
#include "worker/offline/log_probs.h"
#include "worker/runtime/engine.h"
#include "worker/service/worker_options.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/calibration.h"

namespace recall::cli {
namespace {

constexpr char kUsageHead[] =
    R"(usage: recall calibrate-window --model PATH [--tokenizer PATH] [options]

Generates a calibration sample with the full cache while tracking LazyEviction's per-token
state (no eviction), and prints the given percentile of the maximum recurrence intervals
(MRI) observed: the window W that covers that share of recurrences.

It also suggests alpha: beside the full cache, one cache of --policy at --budget-frac of
the text per alpha of --alphas decodes the same tokens; the alpha whose cache agrees best
with the full one (lowest mean KL of the next-token distributions after its first eviction)
is suggested (lazy and lazy+; the other policies take no alpha). --alphas none skips this. With lazy+, --alphas-uniform also tries thresholds
relative to the uniform share of the cache (K / len, recall serve's --alpha-uniform), and
--value-protection / --meta-score give every tried cache those settings.

)";

struct WindowOptions {
  model::LoadOptions model;
  int texts = 8;
  std::optional<int> tokens;  // default: the model's context, at most 2048
  double alpha = 1e-4;
  double percentile = 80;
  std::string prompt = "Once upon a time";
  int64_t seed = 1;
  int threads = 0;
  // The alpha search: the candidates, and the cache each is tried with.
  std::string alphas;  // "": kDefaultAlphas for a policy that takes an alpha, else none
  std::string alphas_uniform = "none";
  std::string policy = "lazy+";
  double value_protection = 0;
  std::string meta_score = "none";
  std::string layer_budgets = "uniform";
  double budget_frac = 0.2;
  int window = serving::CacheDefaults().window;
  std::string out;  // write the suggestion as a calibration file (serving/calibration.h)
};

const flags::FlagSet<WindowOptions>& WindowFlags() {
  static const flags::FlagSet<WindowOptions>* const kFlags = [] {
    auto* f = new flags::FlagSet<WindowOptions>();
    f->Include(
         service::ModelFlags(), [](auto& o) -> auto& { return o.model; })
        .Section("calibration")
        .Int(
            "texts", "N", "sampled texts (default 8)", [](auto& o) -> auto& { return o.texts; }, 1,
            100000)
        .Int(
            "tokens", "N",
            "tokens per text including the prompt (default: the model's context, at most 2048)",
            [](auto& o) -> auto& { return o.tokens; }, 2, 1 << 24)
        .Double(
            "alpha", "A", "importance threshold (default 1e-4)",
            [](auto& o) -> auto& { return o.alpha; }, 1e-12, 0.999999)
        .Double(
            "percentile", "P", "in (0, 100] (default 80)",
            [](auto& o) -> auto& { return o.percentile; }, flags::kAboveZero, 100)
        .Text(
            "prompt", "TEXT", "prompt of every text (default \"Once upon a time\")",
            [](auto& o) -> auto& { return o.prompt; })
        .Int(
            "seed", "S", "first sampling seed (default 1)", [](auto& o) -> auto& { return o.seed; },
            0, INT64_MAX)
        .Int(
            "threads", "N", "CPU threads (default: all cores)",
            [](auto& o) -> auto& { return o.threads; }, 0, 1024)
        .Section("alpha search")
        .String(
            "alphas", "LIST",
            "alphas to try, comma-separated, or none (default 1e-4,3e-4,1e-3,3e-3,1e-2,3e-2\n"
            "for lazy and lazy+, none for the policies that take no alpha)",
            [](auto& o) -> auto& { return o.alphas; })
        .String(
            "alphas-uniform", "LIST",
            "lazy+: also try these relative thresholds K (a token is important at K times\n"
            "the uniform share 1/len), comma-separated, or none (default none)",
            [](auto& o) -> auto& { return o.alphas_uniform; })
        .String(
            "policy", "NAME", "the evicting policy they are tried with (default lazy+)",
            [](auto& o) -> auto& { return o.policy; })
        .Double(
            "value-protection", "F",
            "the tried caches keep this fraction of the budget for the largest values\n"
            "(default 0)",
            [](auto& o) -> auto& { return o.value_protection; }, 0, 0.99)
        .Choice("meta-score", "NAME", "none (default) or caote, for the tried caches",
                [](auto& o) -> auto& { return o.meta_score; }, {"none", "caote"})
        .String(
            "layer-budgets", "SPEC",
            "the tried caches' per-layer split: uniform (default), pyramid, or a profile\n"
            "(recall calibrate)",
            [](auto& o) -> auto& { return o.layer_budgets; })
        .Double(
            "budget-frac", "F", "its budget, a fraction of --tokens (default 0.2)",
            [](auto& o) -> auto& { return o.budget_frac; }, flags::kAboveZero, 1)
        .Int(
            "window", "W", "its window (default 32, as recall serve)",
            [](auto& o) -> auto& { return o.window; }, 1, 1 << 20)
        .String(
            "out", "FILE",
            "write the suggested alpha(s) with the policy, budget fraction, window, value\n"
            "protection and meta score they were measured with to FILE, for recall serve\n"
            "--calibration FILE",
            [](auto& o) -> auto& { return o.out; })
        .Short('m', "model")
        .Short('t', "threads");
    return f;
  }();
  return *kFlags;
}

// A comma-separated list of numbers in (0, hi) (or (0, hi] when `hi_included`; `range` says
// which), or none (empty); an empty item is refused (it was skipped).
absl::StatusOr<std::vector<double>> ParseNumbers(const char* flag, const std::string& list,
                                                 double hi, bool hi_included, const char* range) {
  std::vector<double> out;
  if (list == "none") return out;
  for (absl::string_view a : absl::StrSplit(list, ',')) {
    double x = 0;
    if (!absl::SimpleAtod(a, &x) || !(x > 0 && (x < hi || (hi_included && x == hi)))) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", a, "' is not a number in ", range,
                                                     " (a comma-separated list, or none)"));
    }
    out.push_back(x);
  }
  return out;
}

absl::StatusOr<std::vector<double>> ParseAlphas(const std::string& list) {
  return ParseNumbers("--alphas", list, 1, false, "(0, 1)");
}

absl::StatusOr<std::vector<double>> ParseUniformAlphas(const std::string& list) {
  return ParseNumbers("--alphas-uniform", list, 1e6, true, "(0, 1e6]");
}

// One alpha of the search: its cache, and how far it is from the full cache so far.
struct AlphaTrial {
  double alpha = 0;
  double alpha_uniform = 0;  // > 0: lazy+'s relative threshold instead of alpha
  std::unique_ptr<cache::SequenceCache> seq;
  std::unique_ptr<cache::eviction::SessionEvictor> evictor;
  std::vector<float> probs;
  double kl_sum = 0;
  int64_t top1 = 0;
  int64_t positions = 0;
};

// KL(p || q) of the next-token distributions, from p's log-probabilities and q's logits
// (`logq` is scratch).
double Kl(const std::vector<double>& logp, const float* q_logits, std::vector<double>* logq) {
  offline::LogSoftmax(q_logits, static_cast<int>(logp.size()), logq->data());
  double kl = 0;
  for (size_t i = 0; i < logp.size(); ++i) kl += std::exp(logp[i]) * (logp[i] - (*logq)[i]);
  return std::max(kl, 0.0);
}

constexpr char kDefaultAlphas[] = "1e-4,3e-4,1e-3,3e-3,1e-2,3e-2";

absl::Status Run(const WindowOptions& o) {
  // A policy without an alpha (h2o, tova, ...) gives every alpha the same cache: the search
  // ran one cache per alpha for a tie, and suggested the first.
  const bool takes_alpha = cache::eviction::TakesAlpha(o.policy);
  // What --calibration takes (serving/calibration.cc): a file written for another policy was
  // refused by recall serve after the whole run.
  if (o.alphas != "none" && !cache::eviction::IsEvictingPolicy(o.policy)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--policy: ", o.policy, " is not an evicting policy a calibration applies to (",
        cache::eviction::EvictingPolicyList(), ")"));
  }
  if (!o.alphas.empty() && o.alphas != "none" && !takes_alpha) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--alphas: --policy ", o.policy,
        " takes no alpha (lazy and lazy+ do): every alpha would keep the same cache; drop "
        "--alphas"));
  }
  RECALL_ASSIGN_OR_RETURN(const std::vector<double> alphas,
                          ParseAlphas(!o.alphas.empty() ? o.alphas
                                      : takes_alpha     ? kDefaultAlphas
                                                        : "none"));
  RECALL_ASSIGN_OR_RETURN(const std::vector<double> uniform, ParseUniformAlphas(o.alphas_uniform));
  if (!uniform.empty() && (alphas.empty() || o.policy != "lazy+")) {
    return absl::InvalidArgumentError(
        "--alphas-uniform: lazy+'s relative thresholds, tried beside --alphas; give --policy "
        "lazy+ and an --alphas list");
  }
  if (alphas.empty() && !o.out.empty()) {
    return absl::InvalidArgumentError(
        takes_alpha ? std::string("--out: writes the alpha search's result; drop --alphas none")
                    : absl::StrCat("--out: writes the alpha search's result, and --policy ",
                                   o.policy, " takes no alpha (lazy and lazy+ do)"));
  }
  if (!o.out.empty()) RECALL_RETURN_IF_ERROR(CheckOutputFile("--out", o.out));
  absl::StatusOr<model::Loaded> loaded_or = model::LoadAll(o.model);
  if (!loaded_or.ok()) return WindowFlags().Explain(loaded_or.status());
  model::Loaded& loaded = *loaded_or;
  const model::ModelConfig& c = loaded.model->config;
  const int64_t tokens = o.tokens.value_or(std::min(c.max_seq_len, 2048));
  if (tokens > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens: ", tokens, " is more than the model's context (", c.max_seq_len, ")"));
  }
  const std::vector<int32_t> prompt =
      loaded.tokenizer->Encode(o.prompt, /*add_bos=*/!loaded.hf_tokenizer);
  if (prompt.empty() || static_cast<int64_t>(prompt.size()) >= tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt: ", prompt.size(), " tokens; must be in [1, --tokens)"));
  }
  runtime::EngineOptions eo;
  eo.threads = o.threads;
  const int caches = 1 + static_cast<int>(alphas.size() + uniform.size());
  eo.kv_cache_bytes =
      caches * runtime::KvBytesFor(c, static_cast<int>(tokens) + 16, eo.block_tokens, eo.kv_dtype);
  eo.forward.max_batch_tokens = std::max(static_cast<int>(prompt.size()), caches);
  eo.forward.batch_invariant = false;
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine,
                          runtime::Engine::Create(*loaded.model, eo));
  runtime::ForwardPass& forward = engine->forward(0);
  kernels::Backend& backend = engine->backend(0);
  const int64_t stride = tokens;
  std::vector<float> probs(static_cast<size_t>(c.n_layers) * c.n_heads * stride);
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> mris;
  const int64_t texts = o.texts;
  std::optional<serving::CacheFactory> factory;
  if (!alphas.empty()) {
    serving::CacheDefaults d;
    d.policy = o.policy;
    d.budget_tokens = std::max(1, static_cast<int>(std::ceil(o.budget_frac * tokens - 1e-9)));
    d.window = o.window;
    d.value_protection = o.value_protection;
    d.meta_score = o.meta_score;
    d.layer_budgets = o.layer_budgets;
    d.positions = "original";  // the texts fit the context
    absl::StatusOr<serving::CacheFactory> f =
        serving::CacheFactory::Create(d, c, c.n_kv_heads, 1, eo.kv_dtype);
    // A floor that is the window itself and no fraction of the texts reaches: the window is
    // what to change (other policies' floors, their sinks or query window, are not).
    cache::eviction::PolicyOptions po;
    po.name = o.policy;
    po.window = o.window;
    const auto policy = cache::eviction::CreatePolicy(po);
    const bool window_floor =
        policy.ok() && (*policy)->min_budget() == o.window && o.window >= tokens;
    if (flags::FieldOf(f.status()) == "budget_tokens" && window_floor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--window: ", o.window, " keeps at least as many tokens as the texts have (--tokens ",
          tokens, "): no budget evicts anything; give a window below ", tokens));
    }
    if (flags::FieldOf(f.status()) == "budget_tokens") {  // set from two flags
      return absl::InvalidArgumentError(
          absl::StrCat("--budget-frac: ", o.budget_frac, " x --tokens ", tokens, " = ",
                       flags::FieldWhat(f.status()), " (raise --budget-frac or --tokens)"));
    }
    if (!f.ok()) return WindowFlags().Explain(f.status());  // names the field's flag
    factory.emplace(*std::move(f));
  }
  std::vector<AlphaTrial> trials(alphas.size() + uniform.size());
  for (size_t i = 0; i < alphas.size(); ++i) trials[i].alpha = alphas[i];
  for (size_t i = 0; i < uniform.size(); ++i) {
    trials[alphas.size() + i].alpha = alphas[0];  // unused: the relative threshold replaces it
    trials[alphas.size() + i].alpha_uniform = uniform[i];
  }
  const double alpha = o.alpha, pct = o.percentile;

  for (int64_t text = 0; text < texts; ++text) {
    cache::SequenceCache seq(&engine->pool(0));
    cache::eviction::SessionEvictorOptions so;
    so.policy.name = "lazy";
    so.policy.alpha = static_cast<float>(alpha);
    so.policy.window = 1;
    so.budget.budget = static_cast<double>(tokens);  // never over budget: observe only
    so.n_heads = c.n_heads;
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<cache::eviction::SessionEvictor> evictor,
                            cache::eviction::SessionEvictor::Create(so, &seq));
    for (AlphaTrial& trial : trials) {
      serving::CacheRequest request;
      request.alpha = trial.alpha;
      RECALL_ASSIGN_OR_RETURN(const serving::SessionCacheSpec spec,
                              factory->Resolve(request, static_cast<uint64_t>(o.seed + text)));
      if (!spec.evictor.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--policy: ", o.policy, " does not evict; name an evicting policy"));
      }
      cache::eviction::SessionEvictorOptions to = *spec.evictor;
      to.n_heads = c.n_heads;
      to.policy.alpha_uniform = static_cast<float>(trial.alpha_uniform);
      trial.seq = std::make_unique<cache::SequenceCache>(&engine->pool(0));
      RECALL_ASSIGN_OR_RETURN(trial.evictor,
                              cache::eviction::SessionEvictor::Create(to, trial.seq.get()));
      if (trial.evictor->policy().compresses_prefill()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--policy: ", o.policy,
                         " compresses the prompt; the search needs a decode-time policy"));
      }
      trial.probs.assign(probs.size(), 0.0f);
    }
    std::vector<float> all_logits(static_cast<size_t>(caches) * c.vocab_size);
    std::vector<double> logp(c.vocab_size), logq(c.vocab_size);
    runtime::BatchItem pre{&seq, prompt.data(), static_cast<int>(prompt.size())};
    RECALL_RETURN_IF_ERROR(forward.Run({&pre, 1}, logits.data()));
    for (AlphaTrial& trial : trials) {
      runtime::BatchItem p{trial.seq.get(), prompt.data(), static_cast<int>(prompt.size())};
      RECALL_RETURN_IF_ERROR(forward.Run({&p, 1}, all_logits.data()));
    }
    kernels::SamplingParams sampling;
    sampling.temperature = 1.0f;
    sampling.top_p = 0.95f;
    kernels::Rng rng(static_cast<uint64_t>(o.seed + text));
    std::vector<int32_t> history = prompt;
    std::vector<runtime::BatchItem> batch(static_cast<size_t>(caches));
    while (static_cast<int64_t>(history.size()) < tokens) {
      const int32_t next = backend.Sample(logits.data(), c.vocab_size, sampling, rng,
                                          history.data(), static_cast<int>(history.size()));
      history.push_back(next);
      // Every cache decodes the token the full cache sampled (teacher forcing).
      batch[0] = runtime::BatchItem{&seq, &history.back(), 1, true, probs.data(), stride};
      for (size_t i = 0; i < trials.size(); ++i) {
        batch[i + 1] = runtime::BatchItem{trials[i].seq.get(),    &history.back(), 1, true,
                                          trials[i].probs.data(), stride};
      }
      RECALL_RETURN_IF_ERROR(forward.Run(batch, all_logits.data()));
      std::copy(all_logits.begin(), all_logits.begin() + c.vocab_size, logits.begin());
      RECALL_RETURN_IF_ERROR(evictor->Step(probs.data(), stride));
      bool full_scored = false;
      int32_t full_top = 0;
      for (size_t i = 0; i < trials.size(); ++i) {
        AlphaTrial& trial = trials[i];
        // Judged from the step after its first eviction, as the quality benchmark does.
        if (trial.evictor->evictions() > 0) {
          if (!full_scored) {
            offline::LogSoftmax(logits.data(), c.vocab_size, logp.data());
            full_top = offline::Argmax(logits.data(), c.vocab_size);
            full_scored = true;
          }
          const float* q = all_logits.data() + (i + 1) * c.vocab_size;
          trial.kl_sum += Kl(logp, q, &logq);
          trial.top1 += offline::Argmax(q, c.vocab_size) == full_top ? 1 : 0;
          ++trial.positions;
        }
        RECALL_RETURN_IF_ERROR(trial.evictor->Step(trial.probs.data(), stride));
      }
    }
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int32_t m : evictor->state(l, h).mri) {
          if (m > 0) mris.push_back(m);
        }
      }
    }
  }
  if (mris.empty()) {
    return absl::FailedPreconditionError(
        "no token was important twice: lower --alpha or generate more --tokens");
  }
  std::sort(mris.begin(), mris.end());
  const size_t rank = static_cast<size_t>(std::ceil(pct / 100.0 * mris.size())) - 1;
  std::printf("texts=%lld tokens=%lld alpha=%g recurrences=%zu median_mri=%d p%g_mri=%d\n",
              static_cast<long long>(texts), static_cast<long long>(tokens), alpha, mris.size(),
              mris[(mris.size() - 1) / 2], pct, mris[std::min(rank, mris.size() - 1)]);
  std::printf("suggested --window %d\n", mris[std::min(rank, mris.size() - 1)]);
  if (trials.empty()) return absl::OkStatus();
  std::printf("alpha search: %s at --budget-frac %g (%d tokens), W=%d, against the full cache\n",
              o.policy.c_str(), o.budget_frac,
              static_cast<int>(std::ceil(o.budget_frac * tokens - 1e-9)), o.window);
  if (o.value_protection > 0 || o.meta_score != "none" || o.layer_budgets != "uniform") {
    std::printf("  (every cache with value protection %g, meta score %s, layer budgets %s)\n",
                o.value_protection, o.meta_score.c_str(), o.layer_budgets.c_str());
  }
  // The best of all trials, and the best absolute alpha (the file's alpha, for the policies
  // that do not take a relative one).
  const AlphaTrial* best = nullptr;
  const AlphaTrial* best_absolute = nullptr;
  const auto kl_of = [](const AlphaTrial& t) {
    return t.kl_sum / static_cast<double>(t.positions);
  };
  for (const AlphaTrial& t : trials) {
    const std::string name = t.alpha_uniform > 0 ? absl::StrCat("alpha_uniform=", t.alpha_uniform)
                                                 : absl::StrCat("alpha=", t.alpha);
    if (t.positions == 0) {
      std::printf("  %-18s never evicted: no figure\n", name.c_str());
      continue;
    }
    std::printf("  %-18s mean_kl=%.5f top1=%.2f%% positions=%lld\n", name.c_str(), kl_of(t),
                100.0 * static_cast<double>(t.top1) / static_cast<double>(t.positions),
                static_cast<long long>(t.positions));
    if (best == nullptr || kl_of(t) < kl_of(*best)) best = &t;
    if (t.alpha_uniform == 0 && (best_absolute == nullptr || kl_of(t) < kl_of(*best_absolute))) {
      best_absolute = &t;
    }
  }
  if (best == nullptr || best_absolute == nullptr) {
    return absl::FailedPreconditionError(
        "no alpha's cache evicted: lower --budget-frac or generate more --tokens");
  }
  std::printf("suggested --alpha %g\n", best_absolute->alpha);
  if (best->alpha_uniform > 0) std::printf("suggested --alpha-uniform %g\n", best->alpha_uniform);
  if (!o.out.empty()) {
    serving::EvictionCalibration cal{o.policy, o.budget_frac, o.window, best_absolute->alpha};
    cal.alpha_uniform = best->alpha_uniform;
    cal.value_protection = o.value_protection;
    cal.meta_score = o.meta_score;
    cal.layer_budgets = o.layer_budgets;
    RECALL_RETURN_IF_ERROR(WriteFileWhole("--out", o.out, serving::EvictionCalibrationJson(cal)));
    std::printf("wrote %s (window %d, alpha %g%s): recall serve --calibration %s\n", o.out.c_str(),
                o.window, best_absolute->alpha,
                best->alpha_uniform > 0
                    ? absl::StrCat(", alpha_uniform ", best->alpha_uniform).c_str()
                    : "",
                o.out.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunCalibrateWindow(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << WindowFlags().Help();
      return 0;
    }
  }
  WindowOptions options;
  absl::Status st = WindowFlags().Parse(argv, &options);
  if (st.ok() && options.model.model.empty())
    st = absl::InvalidArgumentError("--model is required");
  if (!st.ok()) {
    std::cerr << "recall calibrate-window: " << st.message()
              << " (recall calibrate-window --help lists the flags)\n";
    return 2;
  }
  st = Run(options);
  if (!st.ok()) {
    std::cerr << "recall calibrate-window: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
