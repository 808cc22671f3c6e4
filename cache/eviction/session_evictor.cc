#include "cache/eviction/session_evictor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/eviction/caote.h"
#include "cache/eviction/lazy_backend_state.h"
#include "cache/eviction/merge.h"
#include "cache/eviction/snapkv_policy.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/kv_rows.h"

namespace recall::cache::eviction {

const std::vector<std::string>& TpEvictionModes() {
  static const std::vector<std::string> kModes = {"uniform", "shared", "head-adaptive"};
  return kModes;
}

absl::Status ApplyTpEvictionMode(const std::string& mode, SessionEvictorOptions& options) {
  options.share_tokens = mode == "shared";
  options.budget.head_adaptive = mode == "head-adaptive";
  if (mode == "uniform" || mode == "shared" || mode == "head-adaptive") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("\"", mode, "\" is not one of uniform, shared, head-adaptive"));
}

std::string TpEvictionConflict(const EvictionPolicy& p, const SessionEvictorOptions& options) {
  if (options.budget.head_adaptive && p.layer_shared()) {
    return absl::StrCat("head-adaptive needs per-KV-head budgets; policy '", p.name(),
                        "' keeps one token set for all heads of a layer");
  }
  if (options.share_tokens) {
    const char* why = options.budget.head_adaptive ? "head-adaptive budgets are per KV head"
                      : p.needs_keys()             ? "it scores each KV head by its own keys"
                      : p.compresses_prefill()     ? "it compresses the prompt per KV head"
                                                   : nullptr;
    if (why != nullptr) {
      return absl::StrCat("shared does not apply to policy '", p.name(), "': ", why);
    }
  }
  return "";
}

absl::StatusOr<std::unique_ptr<SessionEvictor>> SessionEvictor::Create(
    const SessionEvictorOptions& options, SequenceCache* cache) {
  if (cache == nullptr) return absl::InvalidArgumentError("session evictor: cache is null");
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = CreatePolicy(options.policy);
  if (!policy.ok()) return policy.status();
  const int n_kv_heads = cache->View().layout.n_kv_heads;
  const int n_layers = cache->View().layout.n_layers;
  if (!cache->host_readable() &&
      ((*policy)->needs_keys() || (*policy)->needs_value_range() ||
       (*policy)->compresses_prefill() || options.policy.value_protection > 0.0f ||
       options.policy.meta_score != PolicyOptions::MetaScore::kNone || options.policy.merge)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session evictor: policy '", options.policy.name,
        "' (or value protection / a meta score / merging) reads cached K/V rows on the host, "
        "which a GPU cache does not allow yet; on a GPU use full, lazy, h2o, tova or streaming"));
  }
  if (options.n_heads < 1 || options.n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("session evictor: n_heads ", options.n_heads,
                                                   " must be a positive multiple of n_kv_heads ",
                                                   n_kv_heads));
  }
  if (const std::string conflict = TpEvictionConflict(**policy, options); !conflict.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("session evictor: tp_eviction ", conflict));
  }
  if (options.comm != nullptr) {
    const int tp = options.comm->size();
    const int total = options.total_kv_heads > 0 ? options.total_kv_heads : n_kv_heads;
    if (total < n_kv_heads || (static_cast<int64_t>(tp) * n_kv_heads) % total != 0 ||
        options.kv_head_offset < 0 || options.kv_head_offset + n_kv_heads > total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session evictor: KV heads [", options.kv_head_offset, ", ",
          options.kv_head_offset + n_kv_heads, ") of rank ", options.comm->rank(), " of ", tp,
          " do not tile the model's total_kv_heads ", total));
    }
  }
  BudgetOptions budget = options.budget;
  budget.reserved = std::max(budget.reserved, (*policy)->min_budget());
  absl::StatusOr<BudgetAllocator> allocator = BudgetAllocator::Create(budget, n_layers);
  if (!allocator.ok()) return allocator.status();
  return std::unique_ptr<SessionEvictor>(
      new SessionEvictor(options, std::move(*policy), std::move(*allocator), cache));
}

SessionEvictor::SessionEvictor(const SessionEvictorOptions& options,
                               std::unique_ptr<EvictionPolicy> policy, BudgetAllocator budgets,
                               SequenceCache* cache)
    : options_(options),
      policy_(std::move(policy)),
      allocator_(std::move(budgets)),
      cache_(cache),
      n_layers_(cache->View().layout.n_layers),
      n_kv_heads_(cache->View().layout.n_kv_heads),
      head_dim_(cache->View().layout.head_dim),
      shared_(policy_->layer_shared() || options.share_tokens),
      states_per_layer_(shared_ ? 1 : n_kv_heads_),
      states_(static_cast<size_t>(n_layers_) * states_per_layer_,
              HeadState(policy_->state_arrays())),
      state_evictions_(static_cast<size_t>(n_layers_) * states_per_layer_, 0),
      budgets_(static_cast<size_t>(n_layers_)),
      needs_probs_(policy_->needs_attention() ||
                   options.policy.meta_score == PolicyOptions::MetaScore::kCaoteCurrentQuery),
      candidates_(static_cast<size_t>(n_kv_heads_)),
      head_keeps_(static_cast<size_t>(n_kv_heads_)) {
  tp_heads_.n_local = n_kv_heads_;
  tp_heads_.offset = options.kv_head_offset;
  tp_heads_.n_total = options.total_kv_heads > 0 ? options.total_kv_heads : n_kv_heads_;
  if (options.backend != nullptr && !options.backend->memory().host_accessible() &&
      policy_->has_backend_step() && !shared_ && !options.budget.head_adaptive &&
      options.policy.meta_score == PolicyOptions::MetaScore::kNone &&
      options.policy.value_protection <= 0.0f && !options.policy.merge) {
    backend_state_ = std::make_unique<LazyBackendState>(options.backend, n_layers_, n_kv_heads_);
  }
  if (options.comm != nullptr) {
    tp_heads_.replicas = options.comm->size() * n_kv_heads_ / tp_heads_.n_total;
  }
}

SessionEvictor::~SessionEvictor() = default;

int64_t SessionEvictor::state_bytes() const {
  int64_t n = backend_state_ != nullptr ? backend_state_->bytes() : 0;
  for (const HeadState& s : states_) n += s.bytes();
  return n;
}

void SessionEvictor::FollowDrop() {
  if (backend_state_ != nullptr) backend_state_->Pull(states_);
  for (int l = 0; l < n_layers_; ++l) {
    for (int h = 0; h < states_per_layer_; ++h) {
      HeadState& s = states_[static_cast<size_t>(l) * states_per_layer_ + h];
      const int len = cache_->length(l, h);  // a shared state's heads all have its length
      if (s.size() <= len) continue;
      std::vector<int32_t> keep(static_cast<size_t>(len));  // not keep_: last_keep() stays
      std::iota(keep.begin(), keep.end(), 0);
      CompactState(&s, keep);
    }
  }
  if (backend_state_ != nullptr) backend_state_->Shrink(states_);
}

void SessionEvictor::Reserve(int max_len) {
  for (HeadState& s : states_) s.Reserve(max_len);
  reduced_.reserve(static_cast<size_t>(n_kv_heads_) * max_len);
  value_range_.reserve(static_cast<size_t>(max_len));
  if (policy_->needs_keys()) keys_.reserve(static_cast<size_t>(max_len) * head_dim_);
  keep_.reserve(static_cast<size_t>(max_len));
  select_.score.reserve(static_cast<size_t>(max_len));
  select_.order.reserve(static_cast<size_t>(max_len));
  select_.aux.reserve(static_cast<size_t>(max_len));
  select_.aux2.reserve(static_cast<size_t>(max_len));
  if (policy_->needs_keys()) select_.rows.reserve(static_cast<size_t>(max_len) * head_dim_);
  const bool head_adaptive = options_.budget.head_adaptive;
  if (options_.policy.meta_score == PolicyOptions::MetaScore::kNone && !head_adaptive) return;
  const size_t n = static_cast<size_t>(max_len);
  for (size_t h = 0; h < (head_adaptive ? candidates_.size() : 1); ++h) {
    candidates_[h].always.reserve(n);
    candidates_[h].score.reserve(n);
    candidates_[h].value_range.reserve(n);
    head_keeps_[h].reserve(n);
  }
  if (head_adaptive) {
    adaptive_.pool.reserve(n * candidates_.size());
    adaptive_.order.reserve(n);
  }
  if (options_.policy.meta_score != PolicyOptions::MetaScore::kNone) {
    values_.reserve(n * head_dim_);
    for (std::vector<double>* v : {&caote_a_, &caote_c_, &caote_sum_}) v->reserve(n);
    caote_o_.reserve(static_cast<size_t>(head_dim_));
  }
}

const HeadState& SessionEvictor::state(int layer, int head) const {
  RECALL_CHECK(layer >= 0 && layer < n_layers_ && head >= 0 && head < states_per_layer_)
      << "state(" << layer << ", " << head << ") out of range";
  return states_[static_cast<size_t>(layer) * states_per_layer_ + head];
}

void SessionEvictor::ComputeValueRanges(int layer, int head, int len, bool accumulate) {
  const kernels::PagedKvHead rows = cache_->View().Head(layer, head);
  if (!accumulate) value_range_.assign(static_cast<size_t>(len), 0.0f);
  row_.resize(static_cast<size_t>(head_dim_));
  for (int s = 0; s < len; ++s) {
    kernels::LoadKvRow(rows, 1, s, row_.data());
    const float r = ValueRange(row_.data(), head_dim_);
    value_range_[static_cast<size_t>(s)] =
        accumulate ? std::max(value_range_[static_cast<size_t>(s)], r) : r;
  }
}

void SessionEvictor::GatherKeys(int layer, int head, int len) {
  const kernels::PagedKvHead rows = cache_->View().Head(layer, head);
  keys_.resize(static_cast<size_t>(len) * head_dim_);
  for (int s = 0; s < len; ++s) {
    kernels::LoadKvRow(rows, 0, s, keys_.data() + static_cast<int64_t>(s) * head_dim_);
  }
}

void SessionEvictor::GatherValues(int layer, int head, int begin, int end) {
  const kernels::PagedKvHead rows = cache_->View().Head(layer, head);
  values_.resize(static_cast<size_t>(end - begin) * head_dim_);
  for (int s = begin; s < end; ++s) {
    kernels::LoadKvRow(rows, 1, s, values_.data() + static_cast<int64_t>(s - begin) * head_dim_);
  }
}

absl::Status SessionEvictor::PrepareContext(int layer, int head, int len, SelectContext* ctx) {
  ctx->value_range = nullptr;
  ctx->keys = nullptr;
  ctx->head_dim = head_dim_;
  if (options_.policy.value_protection > 0.0f || policy_->needs_value_range()) {
    if (shared_) {
      for (int h = 0; h < n_kv_heads_; ++h) ComputeValueRanges(layer, h, len, h > 0);
      if (options_.comm != nullptr) {
        RECALL_RETURN_IF_ERROR(
            options_.comm->AllReduce(value_range_.data(), len, kernels::ReduceOp::kMax));
      }
    } else {
      ComputeValueRanges(layer, head, len, false);
    }
    ctx->value_range = value_range_.data();
  }
  if (policy_->needs_keys()) {
    RECALL_CHECK(!shared_) << "needs_keys() is per KV head";
    GatherKeys(layer, head, len);
    ctx->keys = keys_.data();
  }
  ctx->layer = layer;
  ctx->head = shared_ ? 0 : options_.kv_head_offset + head;
  ctx->eviction_count = state_evictions_[static_cast<size_t>(layer) * states_per_layer_ + head];
  return absl::OkStatus();
}

absl::Status SessionEvictor::ApplyMetaScore(int layer, int head, int len,
                                            const float* layer_probs, int64_t stride,
                                            CandidateSet* c) {
  const PolicyOptions::MetaScore meta = options_.policy.meta_score;
  const int m = c->num_candidates();
  if (meta == PolicyOptions::MetaScore::kNone || m == 0) return absl::OkStatus();
  const bool shared = shared_;
  caote_sum_.assign(static_cast<size_t>(m), 0.0);
  if (meta == PolicyOptions::MetaScore::kCaote) {
    caote_a_.resize(static_cast<size_t>(m));
    NormalizeScores(c->score.data() + c->begin, m, caote_a_.data());
  }
  for (int h = shared ? 0 : head; h < (shared ? n_kv_heads_ : head + 1); ++h) {
    if (meta == PolicyOptions::MetaScore::kCaote) {
      GatherValues(layer, h, c->begin, c->end);
      caote_c_.resize(static_cast<size_t>(m));
      CaoteScores(caote_a_.data(), m, values_.data(), head_dim_, &caote_o_, caote_c_.data());
      for (int i = 0; i < m; ++i) {
        caote_sum_[static_cast<size_t>(i)] += caote_c_[static_cast<size_t>(i)];
      }
    } else {
      caote_a_.resize(static_cast<size_t>(len));
      GroupMeanAttention(layer_probs, options_.n_heads, n_kv_heads_, stride, h, len,
                         caote_a_.data());
      GatherValues(layer, h, 0, len);
      caote_c_.resize(static_cast<size_t>(len));
      CaoteScores(caote_a_.data(), len, values_.data(), head_dim_, &caote_o_, caote_c_.data());
      for (int i = 0; i < m; ++i) {
        caote_sum_[static_cast<size_t>(i)] += caote_c_[static_cast<size_t>(c->begin + i)];
      }
    }
  }
  if (shared && options_.comm != nullptr) {
    RECALL_RETURN_IF_ERROR(options_.comm->AllReduce(caote_sum_.data(), m, kernels::ReduceOp::kSum));
  }
  std::copy(caote_sum_.begin(), caote_sum_.end(), c->score.begin() + c->begin);
  return absl::OkStatus();
}

absl::Status SessionEvictor::ScoreHead(int layer, int head, const HeadState& state, int len,
                                       int t, const float* layer_probs, int64_t stride,
                                       const SelectContext& ctx) {
  CandidateSet* c = &candidates_[static_cast<size_t>(head)];
  ScoreCandidates(*policy_, state, len, t, ctx, c);
  return ApplyMetaScore(ctx.layer, head, len, layer_probs, stride, c);
}

absl::Status SessionEvictor::SelectForHead(int layer, int head, const HeadState& state, int len,
                                           int budget, int t, const float* layer_probs,
                                           int64_t stride, const SelectContext& ctx) {
  if (options_.policy.meta_score == PolicyOptions::MetaScore::kNone) {
    policy_->SelectKeep(state, len, budget, t, ctx, &keep_);
    return absl::OkStatus();
  }
  RECALL_CHECK(ctx.layer == layer) << "context prepared for another layer";
  RECALL_RETURN_IF_ERROR(ScoreHead(layer, head, state, len, t, layer_probs, stride, ctx));
  SelectUniform(candidates_[static_cast<size_t>(head)], budget, &select_, &keep_);
  return absl::OkStatus();
}

void SessionEvictor::MergeInto(int layer, int head, int len, const std::vector<int32_t>& keep) {
  if (!options_.policy.merge) return;
  const kernels::PagedKvHead rows = cache_->View().Head(layer, head);
  const size_t d = static_cast<size_t>(head_dim_);
  merge_keys_.resize(static_cast<size_t>(len) * d);
  values_.resize(static_cast<size_t>(len) * d);
  for (int s = 0; s < len; ++s) {
    kernels::LoadKvRow(rows, 0, s, merge_keys_.data() + s * d);
    kernels::LoadKvRow(rows, 1, s, values_.data() + s * d);
  }
  const double* weight = nullptr;
  if (merge_probs_ != nullptr) {
    merge_a_.resize(static_cast<size_t>(len));
    GroupMeanAttention(merge_probs_, options_.n_heads, n_kv_heads_, merge_stride_, head, len,
                       merge_a_.data());
    weight = merge_a_.data();
  }
  const MergeOptions mo{options_.policy.merge_threshold, options_.policy.merge_keys};
  if (MergeEvicted(mo, weight, len, keep, head_dim_, merge_keys_.data(), values_.data(), &merge_) ==
      0) {
    return;
  }
  for (const int32_t j : keep) {
    if (merge_.mass[static_cast<size_t>(j)] == 0.0) continue;
    kernels::StoreKvRow(rows, 1, j, values_.data() + j * d);
    if (mo.merge_keys) kernels::StoreKvRow(rows, 0, j, merge_keys_.data() + j * d);
  }
}

void SessionEvictor::CompactHead(int layer, int head, int len, const std::vector<int32_t>& keep,
                                 bool with_state) {
  MergeInto(layer, head, len, keep);
  cache_->Compact(layer, head, keep);
  if (with_state) {
    CompactState(&states_[static_cast<size_t>(layer) * states_per_layer_ + head], keep);
  }
  CountEviction(layer, head, len, static_cast<int>(keep.size()));
}

void SessionEvictor::CountEviction(int layer, int head, int len, int kept) {
  ++state_evictions_[static_cast<size_t>(layer) * states_per_layer_ + head];
  ++evictions_;
  evicted_slots_ += len - kept;
}

void SessionEvictor::DigestKeep(int layer, int head) {
  if (!options_.verify_keep) return;
  replica_digest_.Add(layer);
  replica_digest_.Add(options_.kv_head_offset + head);
  replica_digest_.Add(keep_);
}

bool SessionEvictor::ApplyKeep(int layer, int head, int len, bool with_state) {
  DigestKeep(layer, head);
  if (static_cast<int>(keep_.size()) == len) return false;
  CompactHead(layer, head, len, keep_, with_state);
  return true;
}

absl::StatusOr<bool> SessionEvictor::CompactHeadAdaptive(int layer, int budget,
                                                         bool with_state) {
  RECALL_RETURN_IF_ERROR(SelectAdaptive(layer, budget));
  bool compacted = false;
  for (int h = 0; h < n_kv_heads_; ++h) {
    const std::vector<int32_t>& keep = head_keeps_[static_cast<size_t>(h)];
    const int len = cache_->length(layer, h);
    if (static_cast<int>(keep.size()) == len) continue;
    CompactHead(layer, h, len, keep, with_state);
    compacted = true;
  }
  keep_.assign(head_keeps_.back().begin(), head_keeps_.back().end());
  return compacted;
}

void SessionEvictor::EvictAtNextStep() {
  const int lag = policy_->eviction_lag();
  if (lag > 0) step_ = (step_ / lag + 1) * lag - 1;
}

int SessionEvictor::MaxBudget() {
  allocator_.Allocate(FractionLength(), budgets_.data());
  return *std::max_element(budgets_.begin(), budgets_.end());
}

absl::Status SessionEvictor::CompressPrefill(const float* window_queries, int w, float scale) {
  if (!policy_->compresses_prefill()) {
    return absl::FailedPreconditionError(absl::StrCat("session evictor: policy '", policy_->name(),
                                                      "' does not compress at prefill"));
  }
  if (step_ != 0 || prefill_compressed_) {
    return absl::FailedPreconditionError(
        "session evictor: CompressPrefill must be called once, before the first Step");
  }
  const int prompt = cache_->next_position();
  const int expected_w = std::min(options_.policy.window, prompt);
  if (window_queries == nullptr || w != expected_w || w < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("session evictor: CompressPrefill needs window_queries for w = ", expected_w,
                     " (min(window, prompt length ", prompt, ")), got w = ", w,
                     window_queries == nullptr ? " and null queries" : ""));
  }
  for (int l = 0; l < n_layers_; ++l) {
    for (int h = 0; h < n_kv_heads_; ++h) {
      if (cache_->length(l, h) != prompt) {
        return absl::FailedPreconditionError(absl::StrCat(
            "session evictor: CompressPrefill needs the whole uncompressed prompt in the cache; "
            "(layer ",
            l, ", head ", h, ") holds ", cache_->length(l, h), " of ", prompt, " slots"));
      }
    }
  }
  if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  // The whole prompt was held before it is compressed: that is the session's peak so far.
  NotePeak();
  allocator_.Allocate(prompt, budgets_.data());
  const int n_heads = options_.n_heads;
  const int group = n_heads / n_kv_heads_;
  SelectContext ctx;
  ctx.session = options_.session;
  ctx.scratch = &select_;
  bool compacted = false;
  const bool head_adaptive = options_.budget.head_adaptive;
  for (int l = 0; l < n_layers_; ++l) {
    const int budget = budgets_[static_cast<size_t>(l)];
    const float* q = window_queries + static_cast<int64_t>(l) * w * n_heads * head_dim_;
    // Every head holds the whole prompt, so the layer is over budget iff each head is.
    if (prompt <= budget) continue;
    for (int h = 0; h < n_kv_heads_; ++h) {
      const int len = prompt;
      GatherKeys(l, h, len);
      prefill_state_ = HeadState(kScoreArray);
      AppendSlots(&prefill_state_, len, 0);
      SnapKvPolicy::WindowScores(keys_.data(), len, q, w, n_heads, h * group, group, head_dim_,
                                 scale, &select_, prefill_state_.score.data());
      RECALL_RETURN_IF_ERROR(PrepareContext(l, h, len, &ctx));
      if (head_adaptive) {
        RECALL_RETURN_IF_ERROR(ScoreHead(l, h, prefill_state_, len, 0, nullptr, 0, ctx));
        continue;
      }
      RECALL_RETURN_IF_ERROR(SelectForHead(l, h, prefill_state_, len, budget, 0, nullptr, 0, ctx));
      compacted |= ApplyKeep(l, h, len, /*with_state=*/false);
    }
    if (head_adaptive) {
      RECALL_ASSIGN_OR_RETURN(const bool any, CompactHeadAdaptive(l, budget, /*with_state=*/false));
      compacted |= any;
    }
  }
  if (compacted) cache_->TrimBlocks();
  prefill_state_ = HeadState(kScoreArray);  // gives the prompt's scores back
  prefill_compressed_ = true;
  return VerifyStep(0);
}

absl::Status SessionEvictor::Step(const float* probs, int64_t stride) {
  const bool needs = policy_->needs_attention();
  if (needs_probs_ && probs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session evictor: policy '", policy_->name(), "'",
        needs ? "" : " with meta_score caote_current_query", " needs attention probabilities"));
  }
  if (needs_probs_ && stride < cache_->max_length()) {
    return absl::InvalidArgumentError(absl::StrCat("session evictor: probs_stride ", stride,
                                                   " < cache length ", cache_->max_length()));
  }
  if (policy_->compresses_prefill() && !prefill_compressed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session evictor: policy '", policy_->name(),
        "' compresses the prompt: call CompressPrefill after prefill, before the first Step"));
  }
  if (backend_state_ != nullptr) return StepOnBackend(probs, stride);
  RECALL_RETURN_IF_ERROR(AgreeOnStep());
  const int t = ++step_;
  // Bring the states up to the cache lengths: the step's peak is then held.
  for (int l = 0; l < n_layers_; ++l) {
    const int32_t* lengths = cache_->lengths(l);
    for (int h = 0; h < states_per_layer_; ++h) {
      HeadState& s = states_[static_cast<size_t>(l) * states_per_layer_ + h];
      RECALL_CHECK(s.size() <= lengths[h])
          << "cache (" << l << ", " << h << ") was compacted outside the evictor";
      AppendSlots(&s, lengths[h] - s.size(), t);
    }
  }
  NotePeak();
  allocator_.Allocate(FractionLength(), budgets_.data());
  const int n_heads = options_.n_heads;
  bool compacted = false;

  SelectContext ctx;
  ctx.session = options_.session;
  ctx.scratch = &select_;

  for (int l = 0; l < n_layers_; ++l) {
    const int budget = budgets_[static_cast<size_t>(l)];
    const float* layer_probs =
        needs_probs_ ? probs + static_cast<int64_t>(l) * n_heads * stride : nullptr;
    merge_probs_ = layer_probs;
    merge_stride_ = stride;
    const int32_t* lengths = cache_->lengths(l);
    if (shared_) {
      const int len = lengths[0];
      for (int h = 1; h < n_kv_heads_; ++h) {
        RECALL_CHECK(lengths[h] == len) << "a shared token set needs equal head lengths";
      }
      HeadState& s = states_[static_cast<size_t>(l)];
      if (needs) {
        RECALL_RETURN_IF_ERROR(ReduceShared(layer_probs, stride, len));
        policy_->Observe(&s, reduced_.data(), len, t);
      }
      if (!policy_->ShouldEvict(len, budget, t)) continue;
      RECALL_RETURN_IF_ERROR(PrepareContext(l, 0, len, &ctx));
      RECALL_RETURN_IF_ERROR(SelectForHead(l, 0, s, len, budget, t, layer_probs, stride, ctx));
      if (options_.verify_keep) {
        common_digest_.Add(l);
        common_digest_.Add(keep_);
      }
      if (static_cast<int>(keep_.size()) == len) continue;
      ++state_evictions_[static_cast<size_t>(l)];
      for (int h = 0; h < n_kv_heads_; ++h) {
        MergeInto(l, h, len, keep_);
        cache_->Compact(l, h, keep_);
        ++evictions_;
        evicted_slots_ += len - static_cast<int64_t>(keep_.size());
      }
      CompactState(&s, keep_);
      compacted = true;
      continue;
    }
    if (needs) {
      reduced_.resize(static_cast<size_t>(n_kv_heads_) * stride);
      ReduceGqaMax(layer_probs, n_heads, n_kv_heads_, stride, lengths, reduced_.data());
    }
    HeadState* layer_states = &states_[static_cast<size_t>(l) * states_per_layer_];
    int64_t layer_len = 0;
    for (int h = 0; h < n_kv_heads_; ++h) {
      if (needs) policy_->Observe(&layer_states[h], reduced_.data() + h * stride, lengths[h], t);
      layer_len += lengths[h];
    }
    if (options_.budget.head_adaptive) {
      RECALL_ASSIGN_OR_RETURN(layer_len, LayerLength(layer_len));
      const int64_t layer_budget = static_cast<int64_t>(budget) * tp_heads_.n_total;
      constexpr int64_t kMax = std::numeric_limits<int>::max();
      if (!policy_->ShouldEvict(static_cast<int>(std::min(layer_len, kMax)),
                                static_cast<int>(std::min(layer_budget, kMax)), t)) {
        continue;
      }
      for (int h = 0; h < n_kv_heads_; ++h) {
        RECALL_RETURN_IF_ERROR(PrepareContext(l, h, lengths[h], &ctx));
        RECALL_RETURN_IF_ERROR(
            ScoreHead(l, h, layer_states[h], lengths[h], t, layer_probs, stride, ctx));
      }
      RECALL_ASSIGN_OR_RETURN(const bool any, CompactHeadAdaptive(l, budget, /*with_state=*/true));
      compacted |= any;
      continue;
    }
    RECALL_RETURN_IF_ERROR(EvictHeads(l, budget, t, layer_probs, stride, ctx, &compacted));
  }
  if (compacted) cache_->TrimBlocks();
  return VerifyStep(t);
}

absl::Status SessionEvictor::EvictHeads(int layer, int budget, int t, const float* layer_probs,
                                        int64_t stride, SelectContext& ctx, bool* compacted) {
  const int32_t* lengths = cache_->lengths(layer);
  HeadState* layer_states = &states_[static_cast<size_t>(layer) * states_per_layer_];
  for (int h = 0; h < n_kv_heads_; ++h) {
    const int len = lengths[h];
    if (!policy_->ShouldEvict(len, budget, t)) continue;
    RECALL_RETURN_IF_ERROR(PrepareContext(layer, h, len, &ctx));
    RECALL_RETURN_IF_ERROR(
        SelectForHead(layer, h, layer_states[h], len, budget, t, layer_probs, stride, ctx));
    *compacted |= ApplyKeep(layer, h, len, /*with_state=*/true);
  }
  return absl::OkStatus();
}

}  // namespace recall::cache::eviction
