// Teacher-forced and free-running comparison of evicting KV caches against the full cache,
// for many (policy, budget) configurations at once.
//
// For one text, every configuration runs as one item of the same ForwardPass batch, with
// the full-cache reference as item 0 of that batch (so the reference and "full" at any
// budget see identical arithmetic). Each evicting item has its own SequenceCache and
// SessionEvictor, stepped after every decode forward with the item's attention
// probabilities (EVICTION.md section 6):
//   - teacher-forced: the text is fed token by token after a `prefix`-token prefill; at each
//     position KL(full || evicted) of the next-token distributions (softmax in double) and
//     top-1 agreement, counted over positions after the run's first eviction (a policy that
//     never evicts counts the positions after its cache first exceeds the budget);
//   - recall probes: the probability of each probe word (product over its tokens);
//   - free-running greedy: from the first `greedy_prefix` tokens, greedy decoding; the
//     number of tokens equal to the full cache's continuation before the first difference,
//     capped at length - greedy_prefix.
// Not thread safe (uses the ForwardPass).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/eval_set.h"
#include "cache/block_pool.h"
#include "cache/eviction/eviction_policy.h"
#include "worker/runtime/forward.h"

namespace recall::bench {

struct QualityConfig {
  std::string policy;
  double budget_fraction = 0;  // of the text length
  int budget_tokens = 0;       // C per (layer, KV head) = ceil(fraction * length)
};

// The full cache's outputs on one text, from one run, to compare other runs with: the
// next-token log-probabilities at every teacher-forced position and the greedy continuation.
// Lets runs whose own reference differs (a pool of another KV type) be judged against the
// fp32 FullKV one.
struct FullReference {
  std::vector<std::vector<double>> logp;  // [position - prefix][vocab]
  std::vector<int32_t> greedy;            // greedy tokens after greedy_prefix, to the end
};

struct QualityEvalOptions {
  int window = 16;
  float alpha = 1e-4f;
  int sinks = 4;
  std::string layer_budgets = "uniform";  // recall serve's --layer-budgets
  double layer_alpha = 1.2;
  double value_protection = 0;          // recall serve's --value-protection
  double alpha_uniform = 0;             // recall serve's --alpha-uniform (lazy+ only)
  std::string tp_eviction = "uniform";  // recall serve's --tp-eviction
  cache::eviction::PolicyOptions::MetaScore meta_score =
      cache::eviction::PolicyOptions::MetaScore::kNone;
  double merge_similarity = 2;  // <= 1: merge evicted tokens at this key similarity
  bool merge_keys = false;
  float attention_decay = cache::eviction::PolicyOptions().attention_decay;  // lazy+
  float attention_weight = cache::eviction::PolicyOptions().attention_weight;
  int prefix = 16;          // teacher-forced prefill
  int greedy_prefix = 384;  // greedy prompt
  // When set, this run's full cache (item 0) is written here...
  FullReference* record = nullptr;
  // ...and when set, KL, top-1, perplexity and greedy agreement are taken against this
  // reference instead of item 0.
  const FullReference* reference = nullptr;
};

// Sums over texts; divided out by the report.
struct QualityStats {
  double kl_sum = 0;
  int64_t top1_agree = 0;
  int64_t positions = 0;
  double nll_sum = 0;       // -log p(text token), evicted, over the counted positions
  double nll_full_sum = 0;  // the same positions with the full cache
  int64_t first_eviction_pos_sum = 0;
  int64_t runs_evicted = 0;
  int64_t greedy_tokens_sum = 0;
  int64_t greedy_runs = 0;
  int64_t greedy_cap_sum = 0;
  int64_t greedy_full_matches = 0;  // runs that never diverged
  double recall_prob_sum = 0;
  double recall_prob_full_sum = 0;
  int64_t probes = 0;
  int64_t peak_kv_bytes_max = 0;
  double peak_kv_bytes_sum = 0;
  double final_kv_bytes_sum = 0;
  double full_kv_bytes_sum = 0;
  int64_t evictions = 0;
  int64_t evicted_slots = 0;
  int64_t texts = 0;
};

// Evaluates every configuration on `text`, adding to stats[i] for configs[i].
// `probes` are this text's probes. InvalidArgument for bad options or an unknown policy.
absl::Status EvaluateText(runtime::ForwardPass& forward, cache::BlockPool& pool,
                          const EvalText& text, const std::vector<RecallProbe>& probes,
                          const std::vector<QualityConfig>& configs,
                          const QualityEvalOptions& options, std::vector<QualityStats>* stats);

}  // namespace recall::bench
