// CacheFactory: what one session's KV cache is made of, from its request (CacheRequest, all
// optional) over the worker's defaults (CacheDefaults). The one place where a policy name, a
// budget in tokens or as a fraction, the window, alpha, the TP agreement mode, the layer
// budgets and the episodic settings become evictor options, for the scheduler and for the
// offline drivers alike. A layer-budget profile is read once, when the factory is made.
// Thread safety: immutable after Create; Resolve is const.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cache/eviction/session_evictor.h"
#include "worker/model/model_config.h"
#include "worker/runtime/positions.h"
#include "worker/serving/turn_request.h"

namespace recall::serving {

// The defaults of what a session's CacheRequest leaves unset, and what every session of a
// worker shares (layer budgets, the TP keep check).
struct CacheDefaults {
  std::string policy = "full";            // an eviction policy, "full" or "episodic"
  int budget_tokens = 1024;               // per layer and KV head
  // budget_tokens was chosen (With a request that sets it): CacheFactory::Create refuses it
  // when it leaves no room past the context instead of lowering it as it does the built-in.
  bool budget_given = false;
  std::optional<double> budget_fraction;  // when set, the default budget is this fraction
  int window = 32;
  double alpha = 1e-4;
  std::string tp_eviction = "uniform";  // cache::eviction::TpEvictionModes()
  int episodes = 4;                     // episodic
  std::string embedder = "model";       // episodic: model or tfidf
  int block_tokens = 2048;              // episodic: tokens per block of the build
  int recluster_turns = 4;              // episodic: turns between rebuilds
  // "original" or "compact"; unset: compact for a policy that evicts, original for full.
  std::optional<std::string> positions;
  // Every session alike.
  std::string layer_budgets = "uniform";  // uniform, pyramid, or a profile file
  double layer_alpha = 1.2;               // a JSON profile's exponent
  double value_protection = 0;            // budget share kept for the largest values (VaSE)
  std::string meta_score = "none";        // "none" or "caote" (cache/eviction/caote.h)
  double alpha_uniform = 0;               // lazy+: threshold k / len instead of alpha; 0 = off
  // lazy+: its score's attention term (cache/eviction/eviction_policy.h).
  double attention_weight = cache::eviction::PolicyOptions().attention_weight;
  double attention_decay = cache::eviction::PolicyOptions().attention_decay;
  bool verify_tp_keep = false;            // debug: ranks check they kept the same tokens

  // These defaults with the fields `r` sets in their place (a budget in tokens clears a
  // default fraction and the other way round).
  CacheDefaults With(const CacheRequest& r) const;
};

// One session's cache.
struct SessionCacheSpec {
  std::string policy;  // "full", "episodic" or the eviction policy
  runtime::Positions positions = runtime::Positions::kOriginal;
  // The evictor (unset for full); episodic: the lazy evictor it decodes with. The per-rank
  // fields (n_heads, comm, backend, kv_head_offset) are left to the caller.
  std::optional<cache::eviction::SessionEvictorOptions> evictor;
  // Episodic only.
  int episodes = 0;
  std::string embedder;
  int block_tokens = 0;
  int recluster_turns = 0;

  // Whether such a session ends at the model's context length: it keeps its positions, or its
  // policy evicts at the first prompt only (SnapKV: SnapKvPolicy::compresses_prefill), so
  // compact positions cannot make room (Session::ends_at_context, for a session made).
  bool ends_at_context() const {
    return positions == runtime::Positions::kOriginal || policy == "snapkv";
  }
};

class CacheFactory {
 public:
  // InvalidArgument naming the default's field (policy, budget_fraction, tp_eviction,
  // layer_budgets, layer_alpha, episodes, ...) when the defaults do not make a cache for this
  // model; NotFound when the layer-budget profile cannot be read. `tp` > 1 turns
  // verify_tp_keep on. `kv_dtype` is the type the worker's pools store (a request may name
  // only that one).
  static absl::StatusOr<CacheFactory> Create(const CacheDefaults& defaults,
                                             const model::ModelConfig& config, int total_kv_heads,
                                             int tp,
                                             kernels::KvDType kv_dtype = kernels::KvDType::kF32);

  // The session's cache: InvalidArgument naming the request's field ("cache.policy",
  // "cache.budget_fraction", ...) when its settings cannot make one. `session_seed` seeds
  // the evictor's random choices (VaSE), the same on every rank.
  absl::StatusOr<SessionCacheSpec> Resolve(const CacheRequest& request,
                                           uint64_t session_seed) const;

  const CacheDefaults& defaults() const { return defaults_; }

 private:
  CacheFactory(const CacheDefaults& defaults, const model::ModelConfig& config, int total_kv_heads,
               int tp)
      : defaults_(defaults), config_(config), total_kv_heads_(total_kv_heads), tp_(tp) {}
  // The settings of `d` (the defaults with a request applied); `prefix` names the fields.
  absl::StatusOr<SessionCacheSpec> Make(const CacheDefaults& d, uint64_t session_seed,
                                        const std::string& prefix) const;
  // `d` with its budget in tokens lowered to the largest whose sessions go on past the
  // context, when that is what Make refuses it for ("leaves no room"); else `d`. For a budget
  // nobody chose: the built-in default at the worker's start, the worker's default for a
  // session of another policy.
  CacheDefaults FitBudget(CacheDefaults d, const std::string& prefix) const;

  CacheDefaults defaults_;
  model::ModelConfig config_;
  int total_kv_heads_ = 0;
  int tp_ = 1;
  kernels::KvDType kv_dtype_ = kernels::KvDType::kF32;
  cache::eviction::BudgetOptions layers_;  // the layer split, its profile read
};

}  // namespace recall::serving
