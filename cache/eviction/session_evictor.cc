#include "cache/eviction/session_evictor.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/eviction/snapkv_policy.h"
#include "common/logging.h"

namespace recall::cache::eviction {

absl::StatusOr<std::unique_ptr<SessionEvictor>> SessionEvictor::Create(
    const SessionEvictorOptions& options, SequenceCache* cache) {
  if (cache == nullptr) return absl::InvalidArgumentError("session evictor: cache is null");
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = CreatePolicy(options.policy);
  if (!policy.ok()) return policy.status();
  const int n_kv_heads = cache->View().layout.n_kv_heads;
  const int n_layers = cache->View().layout.n_layers;
  if (options.n_heads < 1 || options.n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("session evictor: n_heads ", options.n_heads,
                                                   " must be a positive multiple of n_kv_heads ",
                                                   n_kv_heads));
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
      states_per_layer_(policy_->layer_shared() ? 1 : n_kv_heads_),
      states_(static_cast<size_t>(n_layers_) * states_per_layer_),
      state_evictions_(static_cast<size_t>(n_layers_) * states_per_layer_, 0),
      budgets_(static_cast<size_t>(n_layers_)) {}

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
}

const HeadState& SessionEvictor::state(int layer, int head) const {
  RECALL_CHECK(layer >= 0 && layer < n_layers_ && head >= 0 && head < states_per_layer_)
      << "state(" << layer << ", " << head << ") out of range";
  return states_[static_cast<size_t>(layer) * states_per_layer_ + head];
}

void SessionEvictor::ComputeValueRanges(int layer, int head, int len, bool accumulate) {
  const kernels::PagedKv kv = cache_->View();
  if (!accumulate) value_range_.assign(static_cast<size_t>(len), 0.0f);
  for (int s = 0; s < len; ++s) {
    const float r = ValueRange(kv.V(layer, head, s), head_dim_);
    value_range_[static_cast<size_t>(s)] =
        accumulate ? std::max(value_range_[static_cast<size_t>(s)], r) : r;
  }
}

void SessionEvictor::GatherKeys(int layer, int head, int len) {
  const kernels::PagedKv kv = cache_->View();
  keys_.resize(static_cast<size_t>(len) * head_dim_);
  for (int s = 0; s < len; ++s) {
    const float* k = kv.K(layer, head, s);
    std::copy(k, k + head_dim_, keys_.data() + static_cast<int64_t>(s) * head_dim_);
  }
}

void SessionEvictor::PrepareContext(int layer, int head, int len, SelectContext* ctx) {
  ctx->value_range = nullptr;
  ctx->keys = nullptr;
  ctx->head_dim = head_dim_;
  if (options_.policy.value_protection > 0.0f || policy_->needs_value_range()) {
    if (policy_->layer_shared()) {
      for (int h = 0; h < n_kv_heads_; ++h) ComputeValueRanges(layer, h, len, h > 0);
    } else {
      ComputeValueRanges(layer, head, len, false);
    }
    ctx->value_range = value_range_.data();
  }
  if (policy_->needs_keys()) {
    RECALL_CHECK(!policy_->layer_shared()) << "needs_keys() is per KV head";
    GatherKeys(layer, head, len);
    ctx->keys = keys_.data();
  }
  ctx->layer = layer;
  ctx->head = policy_->layer_shared() ? 0 : options_.kv_head_offset + head;
  ctx->eviction_count = state_evictions_[static_cast<size_t>(layer) * states_per_layer_ + head];
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
  allocator_.Allocate(prompt, budgets_.data());
  const int n_heads = options_.n_heads;
  const int group = n_heads / n_kv_heads_;
  SelectContext ctx;
  ctx.session = options_.session;
  ctx.scratch = &select_;
  bool compacted = false;
  for (int l = 0; l < n_layers_; ++l) {
    const int budget = budgets_[static_cast<size_t>(l)];
    const float* q = window_queries + static_cast<int64_t>(l) * w * n_heads * head_dim_;
    for (int h = 0; h < n_kv_heads_; ++h) {
      const int len = cache_->length(l, h);
      if (len <= budget) continue;
      GatherKeys(l, h, len);
      prefill_state_.ts.clear();
      prefill_state_.mri.clear();
      prefill_state_.score.clear();
      AppendSlots(&prefill_state_, len, 0);
      SnapKvPolicy::WindowScores(keys_.data(), len, q, w, n_heads, h * group, group, head_dim_,
                                 scale, &select_, prefill_state_.score.data());
      PrepareContext(l, h, len, &ctx);
      policy_->SelectKeep(prefill_state_, len, budget, 0, ctx, &keep_);
      if (static_cast<int>(keep_.size()) == len) continue;
      cache_->Compact(l, h, keep_);
      ++state_evictions_[static_cast<size_t>(l) * states_per_layer_ + h];
      ++evictions_;
      evicted_slots_ += len - static_cast<int64_t>(keep_.size());
      compacted = true;
    }
  }
  if (compacted) cache_->TrimBlocks();
  prefill_compressed_ = true;
  return absl::OkStatus();
}

absl::Status SessionEvictor::Step(const float* probs, int64_t stride) {
  const bool needs = policy_->needs_attention();
  if (needs && probs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("session evictor: policy '", policy_->name(),
                                                   "' needs attention probabilities"));
  }
  if (needs && stride < cache_->max_length()) {
    return absl::InvalidArgumentError(absl::StrCat("session evictor: probs_stride ", stride,
                                                   " < cache length ", cache_->max_length()));
  }
  if (policy_->compresses_prefill() && !prefill_compressed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session evictor: policy '", policy_->name(),
        "' compresses the prompt: call CompressPrefill after prefill, before the first Step"));
  }
  const int t = ++step_;
  peak_bytes_ = std::max(peak_bytes_, cache_->bytes_held());
  allocator_.Allocate(cache_->next_position(), budgets_.data());
  const int n_heads = options_.n_heads;
  bool compacted = false;

  SelectContext ctx;
  ctx.session = options_.session;
  ctx.scratch = &select_;

  for (int l = 0; l < n_layers_; ++l) {
    const int budget = budgets_[static_cast<size_t>(l)];
    const float* layer_probs = needs ? probs + static_cast<int64_t>(l) * n_heads * stride : nullptr;
    const int32_t* lengths = cache_->lengths(l);
    // Bring the states up to the cache lengths.
    for (int h = 0; h < states_per_layer_; ++h) {
      HeadState& s = states_[static_cast<size_t>(l) * states_per_layer_ + h];
      const int len = lengths[h];
      RECALL_CHECK(s.size() <= len) << "cache (" << l << ", " << h
                                    << ") was compacted outside the evictor";
      AppendSlots(&s, len - s.size(), t);
    }
    if (policy_->layer_shared()) {
      const int len = lengths[0];
      for (int h = 1; h < n_kv_heads_; ++h) {
        RECALL_CHECK(lengths[h] == len) << "layer-shared policy needs equal head lengths";
      }
      HeadState& s = states_[static_cast<size_t>(l)];
      if (needs) {
        reduced_.resize(static_cast<size_t>(stride));
        AverageOverHeads(layer_probs, n_heads, stride, len, reduced_.data());
        policy_->Observe(&s, reduced_.data(), len, t);
      }
      if (!policy_->ShouldEvict(len, budget, t)) continue;
      PrepareContext(l, 0, len, &ctx);
      policy_->SelectKeep(s, len, budget, t, ctx, &keep_);
      if (static_cast<int>(keep_.size()) == len) continue;
      ++state_evictions_[static_cast<size_t>(l)];
      for (int h = 0; h < n_kv_heads_; ++h) {
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
    for (int h = 0; h < n_kv_heads_; ++h) {
      HeadState& s = states_[static_cast<size_t>(l) * states_per_layer_ + h];
      const int len = lengths[h];
      if (needs) policy_->Observe(&s, reduced_.data() + h * stride, len, t);
      if (!policy_->ShouldEvict(len, budget, t)) continue;
      PrepareContext(l, h, len, &ctx);
      policy_->SelectKeep(s, len, budget, t, ctx, &keep_);
      if (static_cast<int>(keep_.size()) == len) continue;
      ++state_evictions_[static_cast<size_t>(l) * states_per_layer_ + h];
      cache_->Compact(l, h, keep_);
      CompactState(&s, keep_);
      ++evictions_;
      evicted_slots_ += len - static_cast<int64_t>(keep_.size());
      compacted = true;
    }
  }
  if (compacted) cache_->TrimBlocks();
  return absl::OkStatus();
}

}  // namespace recall::cache::eviction
