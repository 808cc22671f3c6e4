#include "bench/quality/quality_eval.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench/quality/batch_runs.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "common/status.h"

namespace recall::bench {
namespace {

using cache::eviction::SessionEvictor;

std::vector<RunSpec> Specs(const std::vector<QualityConfig>& configs) {
  std::vector<RunSpec> specs;
  for (const QualityConfig& c : configs) specs.push_back({c.policy, c.budget_tokens});
  return specs;
}

PolicyKnobs Knobs(const QualityEvalOptions& o) {
  return {
      o.window,           o.alpha,           o.sinks,           o.layer_budgets, o.layer_alpha,
      o.value_protection, o.alpha_uniform,   o.tp_eviction,     o.meta_score,    o.merge_similarity,
      o.merge_keys,       o.attention_decay, o.attention_weight};
}

absl::Status TeacherForced(runtime::ForwardPass& forward, cache::BlockPool& pool,
                           const EvalText& text, const std::vector<RecallProbe>& probes,
                           const std::vector<QualityConfig>& configs,
                           const QualityEvalOptions& options, std::vector<QualityStats>* stats) {
  const int vocab = forward.model().config.vocab_size;
  const int length = static_cast<int>(text.tokens.size());
  const int k_runs = static_cast<int>(configs.size()) + 1;
  RECALL_ASSIGN_OR_RETURN(std::vector<Run> runs,
                          MakeRuns(forward, pool, Specs(configs), Knobs(options), text.seed));
  std::vector<float> logits(static_cast<size_t>(k_runs) * vocab);
  RECALL_RETURN_IF_ERROR(PrefillRuns(forward, runs, text.tokens.data(), options.prefix,
                                 logits.data()));

  std::vector<int> all(k_runs);
  for (int i = 0; i < k_runs; ++i) all[i] = i;
  std::vector<int32_t> feed(k_runs);
  std::vector<double> logp_full(vocab), logp(vocab);
  // Per run and probe: log-probability of the probe word so far.
  std::vector<double> probe_logp(static_cast<size_t>(k_runs) * probes.size(), 0.0);
  std::vector<int> first_counted(k_runs, -1);

  for (int pos = options.prefix; pos < length - 1; ++pos) {
    // Whether this position counts: the run's cache was compacted before this forward (or,
    // for a policy that never evicts, the context already exceeds the budget).
    std::vector<bool> counted(k_runs, false);
    for (int i = 1; i < k_runs; ++i) {
      const SessionEvictor& e = *runs[i].evictor;
      counted[i] = e.evictions() > 0 ||
                   (e.policy().name() == "full" && pos > configs[i - 1].budget_tokens);
      if (counted[i] && first_counted[i] < 0) first_counted[i] = pos;
    }
    std::fill(feed.begin(), feed.end(), text.tokens[pos]);
    RECALL_RETURN_IF_ERROR(DecodeRuns(forward, runs, all, feed.data(), logits.data()));

    const int32_t target = text.tokens[pos + 1];
    LogSoftmax(logits.data(), vocab, logp_full.data());
    if (options.record != nullptr) options.record->logp.push_back(logp_full);
    if (options.reference != nullptr) {
      const size_t at = static_cast<size_t>(pos - options.prefix);
      if (at >= options.reference->logp.size()) {
        return absl::InvalidArgumentError("the reference has fewer positions than the text");
      }
      logp_full = options.reference->logp[at];
    }
    const int32_t top_full = static_cast<int32_t>(
        std::max_element(logp_full.begin(), logp_full.end()) - logp_full.begin());
    for (int i = 0; i < k_runs; ++i) {
      const float* li = logits.data() + static_cast<size_t>(i) * vocab;
      LogSoftmax(li, vocab, logp.data());
      for (size_t p = 0; p < probes.size(); ++p) {
        if (pos + 1 >= probes[p].start && pos + 1 < probes[p].start + probes[p].n_tokens) {
          probe_logp[i * probes.size() + p] += logp[target];
        }
      }
      if (i == 0 || !counted[i]) continue;
      QualityStats& s = (*stats)[i - 1];
      double kl = 0;
      for (int v = 0; v < vocab; ++v) kl += std::exp(logp_full[v]) * (logp_full[v] - logp[v]);
      s.kl_sum += std::max(kl, 0.0);
      s.top1_agree += Argmax(li, vocab) == top_full ? 1 : 0;
      s.positions += 1;
      s.nll_sum -= logp[target];
      s.nll_full_sum -= logp_full[target];
    }
  }
  for (int i = 1; i < k_runs; ++i) {
    QualityStats& s = (*stats)[i - 1];
    const SessionEvictor& e = *runs[i].evictor;
    if (first_counted[i] >= 0) {
      s.first_eviction_pos_sum += first_counted[i];
      s.runs_evicted += 1;
    }
    for (size_t p = 0; p < probes.size(); ++p) {
      s.recall_prob_sum += std::exp(probe_logp[i * probes.size() + p]);
      s.recall_prob_full_sum += std::exp(probe_logp[p]);
      s.probes += 1;
    }
    s.peak_kv_bytes_max = std::max(s.peak_kv_bytes_max, e.peak_kv_bytes());
    s.peak_kv_bytes_sum += static_cast<double>(e.peak_kv_bytes());
    s.final_kv_bytes_sum += static_cast<double>(e.final_kv_bytes());
    s.full_kv_bytes_sum += static_cast<double>(runs[0].seq->bytes_held());
    s.evictions += e.evictions();
    s.evicted_slots += e.evicted_slots();
    s.texts += 1;
  }
  return absl::OkStatus();
}

absl::Status Greedy(runtime::ForwardPass& forward, cache::BlockPool& pool, const EvalText& text,
                    const std::vector<QualityConfig>& configs, const QualityEvalOptions& options,
                    std::vector<QualityStats>* stats) {
  const int vocab = forward.model().config.vocab_size;
  const int length = static_cast<int>(text.tokens.size());
  const int k_runs = static_cast<int>(configs.size()) + 1;
  const int cap = length - options.greedy_prefix;  // tokens generated at most
  RECALL_ASSIGN_OR_RETURN(std::vector<Run> runs,
                          MakeRuns(forward, pool, Specs(configs), Knobs(options), text.seed));
  std::vector<float> prefill_logits(static_cast<size_t>(k_runs) * vocab);
  RECALL_RETURN_IF_ERROR(PrefillRuns(forward, runs, text.tokens.data(), options.greedy_prefix,
                                 prefill_logits.data()));
  // Prefill leaves the cache whole; as in Generate, the prompt becomes evictable at the
  // first decode step.
  std::vector<int> active(k_runs);
  for (int i = 0; i < k_runs; ++i) active[i] = i;
  std::vector<float> logits = prefill_logits;  // in the order of `active`
  std::vector<int32_t> feed;
  for (int s = 0; s < cap; ++s) {
    int32_t ref = Argmax(logits.data(), vocab);
    if (options.record != nullptr) options.record->greedy.push_back(ref);
    if (options.reference != nullptr) {
      if (s >= static_cast<int>(options.reference->greedy.size())) {
        return absl::InvalidArgumentError("the reference's greedy continuation is too short");
      }
      ref = options.reference->greedy[s];
    }
    std::vector<int> next_active = {0};
    for (size_t j = 1; j < active.size(); ++j) {
      const int32_t tok = Argmax(logits.data() + j * vocab, vocab);
      QualityStats& st = (*stats)[active[j] - 1];
      if (tok != ref) {
        st.greedy_tokens_sum += s;
        st.greedy_runs += 1;
        st.greedy_cap_sum += cap;
      } else if (s == cap - 1) {
        st.greedy_tokens_sum += cap;
        st.greedy_runs += 1;
        st.greedy_cap_sum += cap;
        st.greedy_full_matches += 1;
      } else {
        next_active.push_back(active[j]);
      }
    }
    active = std::move(next_active);
    // A recorded reference runs to the end.
    if ((active.size() == 1 && options.record == nullptr) || s == cap - 1) break;
    feed.assign(active.size(), ref);
    RECALL_RETURN_IF_ERROR(DecodeRuns(forward, runs, active, feed.data(), logits.data()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EvaluateText(runtime::ForwardPass& forward, cache::BlockPool& pool,
                          const EvalText& text, const std::vector<RecallProbe>& probes,
                          const std::vector<QualityConfig>& configs,
                          const QualityEvalOptions& options, std::vector<QualityStats>* stats) {
  const int length = static_cast<int>(text.tokens.size());
  if (options.prefix < 1 || options.prefix >= length - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix must be in [1, ", length - 2, "], got ", options.prefix));
  }
  if (options.greedy_prefix < 1 || options.greedy_prefix >= length) {
    return absl::InvalidArgumentError(absl::StrCat("greedy_prefix must be in [1, ", length - 1,
                                                   "], got ", options.greedy_prefix));
  }
  if (stats->size() != configs.size()) return absl::InternalError("stats size != configs size");
  RECALL_RETURN_IF_ERROR(TeacherForced(forward, pool, text, probes, configs, options, stats));
  return Greedy(forward, pool, text, configs, options, stats);
}

}  // namespace recall::bench
