#include "worker/serving/cache_factory.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/eviction/budget.h"
#include "cache/eviction/eviction_policy.h"
#include "common/flags.h"
#include "common/status.h"

namespace recall::serving {
namespace {

absl::Status Invalid(const std::string& field, const std::string& what) {
  return flags::FieldError(field, what);
}

// What a policy's min_budget() is made of, for the error that names it.
std::string MinBudgetReason(const std::string& policy) {
  if (policy == "streaming" || policy == "vase") return "its sinks and one recent token";
  if (policy == "rkv") return "its query window";
  return "its window W; a smaller window lowers it";
}

// The most slots a (layer, KV head) of a session past the context holds: its layer's budget
// at the context length (the largest layer's, every layer given at least what the policy
// always keeps, as SessionEvictor::Create does), then the policy's lag before it evicts, then
// one step. Head-adaptive (Ada-KV) layers share budget x KV heads slots among their heads, so
// one head may hold up to all of them.
int PeakPastContext(cache::eviction::BudgetOptions budget,
                    const cache::eviction::EvictionPolicy& policy, int context, int n_layers,
                    int kv_heads) {
  budget.reserved = std::max(budget.reserved, policy.min_budget());
  absl::StatusOr<cache::eviction::BudgetAllocator> allocator =
      cache::eviction::BudgetAllocator::Create(budget, n_layers);
  if (!allocator.ok()) return 0;  // said by the caller's own checks
  std::vector<int32_t> budgets(static_cast<size_t>(n_layers));
  allocator->Allocate(context, budgets.data());
  const int64_t largest = *std::max_element(budgets.begin(), budgets.end());
  return static_cast<int>(
      std::min<int64_t>(largest * (budget.head_adaptive ? kv_heads : 1), int64_t{1} << 30) +
      policy.eviction_lag() + 1);
}

// A session with compact positions goes on past the context only if PeakPastContext fits it:
// else its turns fail there ("its policy does not evict enough to go on"), after the session
// was made. Refused naming the budget's field and the largest budget that fits.
absl::Status CheckRoomPastContext(const cache::eviction::BudgetOptions& budget,
                                  const cache::eviction::EvictionPolicy& policy, int context,
                                  int n_layers, int kv_heads, const std::string& field,
                                  const std::string& given) {
  if (PeakPastContext(budget, policy, context, n_layers, kv_heads) <= context) {
    return absl::OkStatus();
  }
  cache::eviction::BudgetOptions tokens = budget;
  tokens.unit = cache::eviction::BudgetOptions::Unit::kTokens;
  int lo = 0, hi = context;  // the largest budget in tokens that fits: in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    tokens.budget = mid;
    (PeakPastContext(tokens, policy, context, n_layers, kv_heads) <= context ? lo : hi) = mid;
  }
  const bool fraction = absl::EndsWith(field, "budget_fraction");
  const std::string lag =
      policy.eviction_lag() > 0
          ? absl::StrCat(" and grows ", policy.eviction_lag(), " more before ", policy.name(),
                         " evicts (its ", policy.name() == "rkv" ? "interval" : "window", ")")
          : "";
  return Invalid(
      field,
      absl::StrCat(
          given, " leaves no room to go on past the model's context length (", context,
          "): a session there keeps its budget in each ",
          budget.head_adaptive ? "layer, all of it in one KV head at worst (head-adaptive)"
                               : "layer",
          lag, ", so it would fill the context and stop; give ",
          lo >= policy.min_budget()
              ? (fraction ? absl::StrCat("at most ", std::floor(1000.0 * lo / context) / 1000)
                          : absl::StrCat("at most ", lo))
          : policy.min_budget() == policy.options().window ? "a smaller window"
                                                           : "positions original",
          lo >= policy.min_budget() || policy.min_budget() == policy.options().window
              ? " (or positions original, which ends the session at the context)"
              : " (it ends the session at the context)"));
}

}  // namespace

CacheDefaults CacheDefaults::With(const CacheRequest& r) const {
  CacheDefaults d = *this;
  if (r.policy.has_value()) d.policy = *r.policy;
  if (r.budget_tokens.has_value()) {
    d.budget_tokens = *r.budget_tokens;
    d.budget_given = true;
    d.budget_fraction.reset();
  }
  if (r.budget_fraction.has_value()) d.budget_fraction = *r.budget_fraction;
  if (r.window.has_value()) d.window = *r.window;
  if (r.alpha.has_value()) d.alpha = *r.alpha;
  if (r.tp_eviction.has_value()) d.tp_eviction = *r.tp_eviction;
  if (r.episodes.has_value()) d.episodes = *r.episodes;
  if (r.embedder.has_value()) d.embedder = *r.embedder;
  if (r.block_tokens.has_value()) d.block_tokens = *r.block_tokens;
  if (r.recluster_turns.has_value()) d.recluster_turns = *r.recluster_turns;
  if (r.positions.has_value()) d.positions = *r.positions;
  return d;
}

absl::StatusOr<CacheFactory> CacheFactory::Create(const CacheDefaults& defaults,
                                                  const model::ModelConfig& config,
                                                  int total_kv_heads, int tp,
                                                  kernels::KvDType kv_dtype) {
  CacheFactory f(defaults, config, total_kv_heads, tp);
  f.kv_dtype_ = kv_dtype;
  cache::eviction::ApplyLayerBudgets(defaults.layer_budgets, defaults.layer_alpha, &f.layers_);
  if (!(defaults.layer_alpha >= 0.5 && defaults.layer_alpha <= 3)) {
    return Invalid("layer_alpha", absl::StrCat("must be in [0.5, 3], got ", defaults.layer_alpha));
  }
  // A profile that cannot be read or parsed is a bad setting (InvalidArgument).
  if (absl::Status st = cache::eviction::LoadProfile(config.n_layers, &f.layers_); !st.ok()) {
    return flags::FieldError("layer_budgets", st.message());
  }
  if (absl::Status st =
          cache::eviction::BudgetAllocator::Create(f.layers_, config.n_layers).status();
      !st.ok()) {
    return flags::FieldError("layer_budgets", st.message());
  }
  // The defaults must make a cache by themselves. The built-in budget (1024 tokens) on a model
  // whose context leaves no room for it past the context is lowered to the largest that does
  // (stories260K's 512: sessions made with it stopped after a few turns). A budget given as
  // --budget, whatever its value, is refused naming the largest that fits.
  if (!defaults.budget_given && defaults.budget_tokens == CacheDefaults().budget_tokens) {
    f.defaults_ = f.FitBudget(f.defaults_, "");
  }
  RECALL_RETURN_IF_ERROR(f.Make(f.defaults_, 0, "").status());
  return f;
}

CacheDefaults CacheFactory::FitBudget(CacheDefaults d, const std::string& prefix) const {
  // Monotone in the budget, unlike Make's success (a budget below what the policy keeps
  // fails too): the search keeps to the room refusal.
  const auto room_refused = [&](const CacheDefaults& x) {
    const absl::Status st = Make(x, 0, prefix).status();
    return !st.ok() && flags::FieldOf(st) == prefix + "budget_tokens" &&
           absl::StrContains(st.message(), "leaves no room");
  };
  if (d.budget_fraction.has_value() || !room_refused(d)) return d;
  int lo = 0, hi = d.budget_tokens;  // the largest budget that leaves room: in [lo, hi)
  while (hi - lo > 1) {
    CacheDefaults x = d;
    x.budget_tokens = (lo + hi) / 2;
    (room_refused(x) ? hi : lo) = x.budget_tokens;
  }
  d.budget_tokens = std::max(lo, 1);
  return d;
}

absl::StatusOr<SessionCacheSpec> CacheFactory::Resolve(const CacheRequest& request,
                                                       uint64_t session_seed) const {
  if (request.kv_dtype.has_value() && *request.kv_dtype != kernels::KvDTypeName(kv_dtype_)) {
    const bool known = *request.kv_dtype == "f32" || *request.kv_dtype == "bf16" ||
                       *request.kv_dtype == "f16" || *request.kv_dtype == "int8";
    return Invalid(
        "cache.kv_dtype",
        known ? absl::StrCat("this worker stores ", kernels::KvDTypeName(kv_dtype_),
                             " (its --kv-dtype); a session cannot choose ", *request.kv_dtype)
              : absl::StrCat("\"", *request.kv_dtype, "\" is not one of f32, bf16, f16, int8"));
  }
  // Episode settings for a session that builds no episodes were dropped without a word.
  CacheDefaults settings = defaults_.With(request);
  // A session choosing another policy without a budget takes the worker's default lowered to
  // fit (refused naming cache.budget_tokens, which it had not given).
  if (!request.budget_tokens.has_value() && !request.budget_fraction.has_value()) {
    settings = FitBudget(settings, "cache.");
  }
  if (settings.policy != "episodic") {
    for (const auto& [field, given] :
         {std::pair<const char*, bool>{"episodes", request.episodes.has_value()},
          {"embedder", request.embedder.has_value()},
          {"block_tokens", request.block_tokens.has_value()},
          {"recluster_turns", request.recluster_turns.has_value()}}) {
      if (given) {
        return Invalid(
            absl::StrCat("cache.", field),
            absl::StrCat("a setting of episodic sessions only; this session's policy is ",
                         settings.policy,
                         request.policy.has_value() ? "" : " (the worker's default)"));
      }
    }
  }
  absl::StatusOr<SessionCacheSpec> spec = Make(settings, session_seed, "cache.");
  // A window past the worker's default budget: the field the session set is the one to name
  // (the message named cache.budget_tokens, which the session had not given).
  constexpr absl::string_view kBudget = "cache.budget_tokens: ";
  if (!spec.ok() && request.window.has_value() && !request.budget_tokens.has_value() &&
      absl::StartsWith(spec.status().message(), kBudget)) {
    return Invalid("cache.window", absl::StrCat(*request.window,
                                                " needs a larger budget: the worker's default "
                                                "budget_tokens ",
                                                spec.status().message().substr(kBudget.size()),
                                                ", or a smaller window"));
  }
  return spec;
}

absl::StatusOr<SessionCacheSpec> CacheFactory::Make(const CacheDefaults& d, uint64_t seed,
                                                    const std::string& prefix) const {
  SessionCacheSpec spec;
  spec.policy = d.policy;
  const auto& names = cache::eviction::PolicyNames();
  const bool episodic = d.policy == "episodic";
  if (!episodic && std::find(names.begin(), names.end(), d.policy) == names.end()) {
    std::string known = "episodic";
    for (const std::string& n : names) absl::StrAppend(&known, ", ", n);
    return Invalid(prefix + "policy",
                   absl::StrCat("unknown policy \"", d.policy, "\" (one of ", known, ")"));
  }
  const auto& modes = cache::eviction::TpEvictionModes();
  if (std::find(modes.begin(), modes.end(), d.tp_eviction) == modes.end()) {
    return Invalid(prefix + "tp_eviction", absl::StrCat("\"", d.tp_eviction,
                                                        "\" is not one of uniform, shared, "
                                                        "head-adaptive"));
  }
  if (d.budget_fraction.has_value() && !(*d.budget_fraction > 0 && *d.budget_fraction <= 1)) {
    return Invalid(prefix + "budget_fraction",
                   absl::StrCat("must be in (0, 1], got ", *d.budget_fraction));
  }
  if (d.budget_tokens < 1) {
    return Invalid(prefix + "budget_tokens", absl::StrCat("must be >= 1, got ", d.budget_tokens));
  }
  if (d.window < 1) return Invalid(prefix + "window", absl::StrCat("must be >= 1, got ", d.window));
  if (!(d.alpha > 0 && d.alpha < 1)) {
    return Invalid(prefix + "alpha", absl::StrCat("must be in (0, 1), got ", d.alpha));
  }
  if (!(d.value_protection >= 0 && d.value_protection < 1)) {
    return Invalid("value_protection", absl::StrCat("must be in [0, 1), got ", d.value_protection));
  }
  if (d.positions.has_value() && *d.positions != "original" && *d.positions != "compact") {
    return Invalid(prefix + "positions",
                   absl::StrCat("\"", *d.positions, "\" is not one of original, compact"));
  }
  if (d.policy == "full" && d.positions == "compact") {
    return Invalid(prefix + "positions",
                   "compact needs a policy that evicts (a full cache grows with the session)");
  }
  spec.positions = d.policy != "full" && d.positions != "original" ? runtime::Positions::kCompact
                                                                   : runtime::Positions::kOriginal;
  if (d.policy == "full") return spec;

  cache::eviction::SessionEvictorOptions o;
  o.policy.name = episodic ? "lazy" : d.policy;  // EpiCache decodes with LazyEviction
  o.policy.window = d.window;
  o.policy.alpha = static_cast<float>(d.alpha);
  o.policy.value_protection = static_cast<float>(d.value_protection);
  o.policy.attention_weight = static_cast<float>(d.attention_weight);
  o.policy.attention_decay = static_cast<float>(d.attention_decay);
  if (d.alpha_uniform > 0) {
    // lazy+'s threshold; a session choosing another policy keeps its alpha, but the worker's
    // own default policy must be lazy+ (prefix "" is the worker's defaults).
    if (d.policy != "lazy+" && prefix.empty()) {
      return Invalid("alpha_uniform",
                     absl::StrCat("a threshold of lazy+ only, not of ", d.policy, " ({policy})"));
    }
    if (d.policy == "lazy+") o.policy.alpha_uniform = static_cast<float>(d.alpha_uniform);
  }
  if (d.meta_score == "caote") {
    // CAOTE rescores an attention estimate: the policies that have one take it; a session
    // choosing another policy keeps that policy's own ranking, but the worker's own default
    // policy must take it (prefix "" is the worker's defaults).
    const bool takes = !episodic && cache::eviction::TakesCaote(d.policy);
    if (!takes && prefix.empty()) {
      return Invalid("meta_score", absl::StrCat("caote ranks by an attention estimate: h2o, tova, "
                                                "lazy, lazy+ or snapkv, not ",
                                                d.policy));
    }
    if (takes) o.policy.meta_score = cache::eviction::PolicyOptions::MetaScore::kCaote;
  } else if (d.meta_score != "none") {
    return Invalid("meta_score", absl::StrCat("\"", d.meta_score, "\" is not one of none, caote"));
  }
  o.budget = layers_;
  if (d.budget_fraction.has_value() && episodic) {
    // Episodes are built to a budget in tokens: the fraction of the context length (what a
    // fraction means for every policy once a session passes the context).
    o.budget.budget =
        std::max(1.0, std::round(*d.budget_fraction * static_cast<double>(config_.max_seq_len)));
  } else if (d.budget_fraction.has_value()) {
    o.budget.unit = cache::eviction::BudgetOptions::Unit::kFraction;
    o.budget.budget = *d.budget_fraction;
  } else {
    o.budget.budget = d.budget_tokens;
  }
  RECALL_ASSIGN_OR_RETURN(const std::unique_ptr<cache::eviction::EvictionPolicy> policy,
                          cache::eviction::CreatePolicy(o.policy));
  const std::string budget_field =
      prefix + (d.budget_fraction.has_value() ? "budget_fraction" : "budget_tokens");
  if (!d.budget_fraction.has_value() || episodic) {
    // A budget in tokens below what the policy always keeps would be raised to it silently
    // (BudgetOptions::reserved): the session would hold more than it was given. (An episode
    // set's budget below lazy's window failed every build, said only in the worker's log.)
    const int budget = static_cast<int>(o.budget.budget);
    if (budget < policy->min_budget()) {
      return Invalid(
          budget_field,
          absl::StrCat(
              episodic && d.budget_fraction.has_value()
                  ? absl::StrCat(*d.budget_fraction, " (", budget, " tokens of the context length)")
                  : absl::StrCat(budget),
              " is below the ", policy->min_budget(), " tokens per layer and KV head that ",
              o.policy.name, " always keeps (", MinBudgetReason(o.policy.name),
              "): give a budget of at least ", policy->min_budget()));
    }
  }
  o.session = seed;
  o.total_kv_heads = total_kv_heads_;
  o.n_heads = config_.n_heads;
  o.verify_keep = d.verify_tp_keep && tp_ > 1;
  o.fraction_cap = config_.max_seq_len;
  RECALL_RETURN_IF_ERROR(cache::eviction::ApplyTpEvictionMode(d.tp_eviction, o));
  // Said when the settings are given (a worker's start, a session's creation), not by every
  // turn of a session made with them.
  if (const std::string conflict = cache::eviction::TpEvictionConflict(*policy, o);
      !conflict.empty()) {
    return Invalid(prefix + "tp_eviction",
                   absl::StrCat(conflict, prefix.empty() ? " ({policy})" : ""));
  }
  if (spec.positions == runtime::Positions::kCompact && !policy->compresses_prefill()) {
    RECALL_RETURN_IF_ERROR(CheckRoomPastContext(
        o.budget, *policy, config_.max_seq_len, config_.n_layers, total_kv_heads_, budget_field,
        d.budget_fraction.has_value() ? absl::StrCat(*d.budget_fraction)
                                      : absl::StrCat(d.budget_tokens)));
  }
  spec.evictor = o;
  if (episodic) {
    CacheRequest e;
    e.episodes = d.episodes;
    e.embedder = d.embedder;
    e.block_tokens = d.block_tokens;
    e.recluster_turns = d.recluster_turns;
    if (absl::Status st = ValidateEpisodicSettings(e); !st.ok()) {
      // ValidateEpisodicSettings names "cache.<field>".
      std::string msg(st.message());
      if (prefix.empty() && msg.rfind("cache.", 0) == 0) msg = msg.substr(6);
      const std::string field = msg.substr(0, msg.find(':'));
      return flags::FieldError(field, msg.substr(std::min(msg.size(), field.size() + 2)));
    }
    spec.episodes = d.episodes;
    spec.embedder = d.embedder;
    // An episode's build holds its budget and a block at once, within the context: a larger
    // block is cut to fit (the default 2048 on a 512-token model failed every build, and only
    // the worker's log said so).
    const int budget = static_cast<int>(o.budget.budget);
    if (config_.max_seq_len - budget < 16) {
      return Invalid(prefix + (d.budget_fraction.has_value() ? "budget_fraction" : "budget_tokens"),
                     absl::StrCat("an episode's budget of ", budget,
                                  " tokens leaves no block of 16 in the context length ",
                                  config_.max_seq_len));
    }
    spec.block_tokens = std::min(d.block_tokens, config_.max_seq_len - budget);
    spec.recluster_turns = d.recluster_turns;
  }
  return spec;
}

}  // namespace recall::serving
