#include "bench/quality/batch_runs.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/serving/cache_factory.h"

namespace recall::bench {

using cache::SequenceCache;
using cache::eviction::SessionEvictor;

absl::StatusOr<std::vector<Run>> MakeRuns(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                          const std::vector<RunSpec>& specs,
                                          const PolicyKnobs& knobs, uint64_t session) {
  const model::ModelConfig& mc = forward.model().config;
  std::vector<Run> runs(specs.size() + 1);
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].seq = std::make_unique<SequenceCache>(&pool);
    if (i == 0) continue;
    const RunSpec& c = specs[i - 1];
    // The evictor a worker would make for these settings (serving::CacheFactory, the one
    // place settings become evictor options), so the benchmark measures what users run.
    serving::CacheDefaults defaults;
    // A worker makes no evictor for "full"; the benchmark's FullKV rows still need one that
    // never evicts (for the same accounting of memory and counted positions), so it takes
    // the options resolved for another policy with the name swapped.
    const bool full = c.policy == "full";
    defaults.policy = full ? "streaming" : c.policy;
    defaults.budget_tokens = c.budget_tokens;
    defaults.window = knobs.window;
    defaults.alpha = knobs.alpha;
    defaults.layer_budgets = knobs.layer_budgets;
    defaults.layer_alpha = knobs.layer_alpha;
    defaults.value_protection = knobs.value_protection;
    if (c.policy == "lazy+") defaults.alpha_uniform = knobs.alpha_uniform;
    defaults.tp_eviction = knobs.tp_eviction;
    // Within the context (no session here goes past it): any budget up to it is a setting.
    defaults.positions = "original";
    RECALL_ASSIGN_OR_RETURN(const serving::CacheFactory factory,
                            serving::CacheFactory::Create(defaults, mc, mc.n_kv_heads, 1));
    RECALL_ASSIGN_OR_RETURN(const serving::SessionCacheSpec spec,
                            factory.Resolve(serving::CacheRequest(), session));
    if (!spec.evictor.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("policy ", c.policy, " does not evict"));
    }
    cache::eviction::SessionEvictorOptions eo = *spec.evictor;
    if (full) eo.policy.name = "full";
    eo.policy.sinks = knobs.sinks;  // benchmark knobs the serving settings do not expose
    // The meta score goes to the policies that take it (CreatePolicy's rule), as a worker's
    // --meta-score does; the others keep their own ranking.
    using MetaScore = cache::eviction::PolicyOptions::MetaScore;
    if (!full &&
        (knobs.meta_score == MetaScore::kNone ||
         (knobs.meta_score == MetaScore::kCaote && cache::eviction::TakesCaote(c.policy)) ||
         (knobs.meta_score == MetaScore::kCaoteCurrentQuery && c.policy != "snapkv"))) {
      eo.policy.meta_score = knobs.meta_score;
    }
    if (!full && knobs.merge_similarity <= 1) {
      eo.policy.merge = true;
      eo.policy.merge_threshold = static_cast<float>(knobs.merge_similarity);
      eo.policy.merge_keys = knobs.merge_keys;
    }
    eo.policy.attention_decay = knobs.attention_decay;
    eo.policy.attention_weight = knobs.attention_weight;
    eo.n_heads = mc.n_heads;
    RECALL_ASSIGN_OR_RETURN(runs[i].evictor, SessionEvictor::Create(eo, runs[i].seq.get()));
    if (runs[i].evictor->policy().needs_attention()) {
      runs[i].probs.resize(static_cast<size_t>(mc.n_layers) * mc.n_heads * mc.max_seq_len);
    }
  }
  return runs;
}

absl::Status PrefillRuns(runtime::ForwardPass& forward, std::vector<Run>& runs,
                         const int32_t* tokens, int n, float* logits) {
  const model::ModelConfig& mc = forward.model().config;
  std::vector<float> window_queries;
  for (size_t i = 0; i < runs.size(); ++i) {
    runtime::BatchItem item;
    item.cache = runs[i].seq.get();
    item.tokens = tokens;
    item.n = n;
    SessionEvictor* evictor = runs[i].evictor.get();
    const bool compress = evictor != nullptr && evictor->policy().compresses_prefill();
    if (compress) {
      item.window_w = std::min(evictor->policy().options().window, n);
      item.window_first = n - item.window_w;
      window_queries.resize(static_cast<size_t>(mc.n_layers) * item.window_w * mc.n_heads *
                            mc.head_dim);
      item.window_queries = window_queries.data();
    }
    RECALL_RETURN_IF_ERROR(forward.Run({&item, 1}, logits + i * mc.vocab_size));
    if (compress) {
      RECALL_RETURN_IF_ERROR(evictor->CompressPrefill(window_queries.data(), item.window_w));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeRuns(runtime::ForwardPass& forward, std::vector<Run>& runs,
                        const std::vector<int>& active, const int32_t* tokens, float* logits) {
  const int64_t stride = forward.model().config.max_seq_len;
  std::vector<runtime::BatchItem> batch(active.size());
  for (size_t j = 0; j < active.size(); ++j) {
    Run& r = runs[active[j]];
    batch[j].cache = r.seq.get();
    batch[j].tokens = tokens + j;
    batch[j].n = 1;
    batch[j].attn_probs = r.probs.empty() ? nullptr : r.probs.data();
    batch[j].probs_stride = r.probs.empty() ? 0 : stride;
  }
  RECALL_RETURN_IF_ERROR(forward.Run(batch, logits));
  for (size_t j = 0; j < active.size(); ++j) {
    Run& r = runs[active[j]];
    if (r.evictor != nullptr) {
      RECALL_RETURN_IF_ERROR(r.evictor->Step(batch[j].attn_probs, batch[j].probs_stride));
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::bench
