#include "worker/engine/sequence.h"

#include <algorithm>

#include "common/status.h"

namespace recall::engine {

LocalSequence::LocalSequence(ForwardPass& forward, std::unique_ptr<cache::SequenceCache> cache)
    : forward_(forward), cache_(std::move(cache)) {}

absl::StatusOr<std::unique_ptr<LocalSequence>> LocalSequence::Create(
    ForwardPass& forward, cache::BlockPool& pool,
    const std::optional<cache::eviction::SessionEvictorOptions>& eviction) {
  std::unique_ptr<LocalSequence> seq(
      new LocalSequence(forward, std::make_unique<cache::SequenceCache>(&pool)));
  if (!eviction.has_value()) return seq;
  const model::ModelConfig& config = forward.model().config;
  cache::eviction::SessionEvictorOptions o = *eviction;
  o.n_heads = config.n_heads;
  RECALL_ASSIGN_OR_RETURN(seq->evictor_,
                          cache::eviction::SessionEvictor::Create(o, seq->cache_.get()));
  if (seq->evictor_->policy().needs_attention() ||
      o.policy.meta_score == cache::eviction::PolicyOptions::MetaScore::kCaoteCurrentQuery) {
    seq->probs_stride_ = config.max_seq_len;  // a head never holds more slots than the context
    seq->probs_.resize(static_cast<size_t>(config.n_layers) * config.n_heads *
                       seq->probs_stride_);
  }
  return seq;
}

absl::Status LocalSequence::Prefill(std::span<const int32_t> prompt, int chunk, float* logits) {
  const model::ModelConfig& config = forward_.model().config;
  const int len = static_cast<int>(prompt.size());
  // Prefill-time compression (SnapKV) scores the prompt by its last `window` queries.
  std::vector<float> window_queries;
  int window_w = 0;
  if (evictor_ != nullptr && evictor_->policy().compresses_prefill()) {
    window_w = std::min(evictor_->policy().options().window, len);
    window_queries.resize(static_cast<size_t>(config.n_layers) * window_w * config.n_heads *
                          config.head_dim);
  }
  for (int start = 0; start < len; start += chunk) {
    BatchItem item;
    item.cache = cache_.get();
    item.tokens = prompt.data() + start;
    item.n = std::min(chunk, len - start);
    item.want_logits = start + item.n == len;
    if (window_w > 0) {
      item.window_queries = window_queries.data();
      item.window_w = window_w;
      item.window_first = len - window_w;
    }
    RECALL_RETURN_IF_ERROR(forward_.Run({&item, 1}, item.want_logits ? logits : nullptr));
  }
  peak_bytes_ = std::max(peak_bytes_, cache_->bytes_held());
  if (window_w > 0) return evictor_->CompressPrefill(window_queries.data(), window_w);
  return absl::OkStatus();
}

absl::Status LocalSequence::Decode(int32_t token, float* logits) {
  BatchItem item;
  item.cache = cache_.get();
  item.tokens = &token;
  item.n = 1;
  item.attn_probs = probs_.empty() ? nullptr : probs_.data();
  item.probs_stride = probs_stride_;
  RECALL_RETURN_IF_ERROR(forward_.Run({&item, 1}, logits));
  peak_bytes_ = std::max(peak_bytes_, cache_->bytes_held());
  if (evictor_ == nullptr) return absl::OkStatus();
  return evictor_->Step(item.attn_probs, probs_stride_);
}

SequenceStats LocalSequence::stats() const {
  SequenceStats s;
  s.kv_bytes = cache_->bytes_held();
  s.peak_kv_bytes = peak_bytes_;
  if (evictor_ != nullptr) {
    s.evictions = evictor_->evictions();
    s.evicted_slots = evictor_->evicted_slots();
  }
  return s;
}

}  // namespace recall::engine
