#include "worker/offline/sequence.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::offline {

LocalSequence::LocalSequence(runtime::ForwardPass& forward,
                             std::unique_ptr<cache::SequenceCache> owned,
                             cache::SequenceCache* cache)
    : forward_(forward), owned_(std::move(owned)), cache_(cache) {}

absl::StatusOr<std::unique_ptr<LocalSequence>> LocalSequence::Create(
    runtime::ForwardPass& forward, cache::BlockPool& pool,
    const std::optional<cache::eviction::SessionEvictorOptions>& eviction,
    runtime::Positions positions) {
  auto cache = std::make_unique<cache::SequenceCache>(&pool);
  cache::SequenceCache* raw = cache.get();
  std::unique_ptr<LocalSequence> seq(new LocalSequence(forward, std::move(cache), raw));
  RECALL_RETURN_IF_ERROR(seq->MakeEvictor(eviction));
  if (positions == runtime::Positions::kCompact && eviction.has_value()) {
    seq->positions_ = positions;
  }
  return seq;
}

absl::StatusOr<std::unique_ptr<LocalSequence>> LocalSequence::CreateOn(
    runtime::ForwardPass& forward, cache::SequenceCache* cache,
    const std::optional<cache::eviction::SessionEvictorOptions>& eviction) {
  std::unique_ptr<LocalSequence> seq(new LocalSequence(forward, nullptr, cache));
  RECALL_RETURN_IF_ERROR(seq->MakeEvictor(eviction));
  seq->peak_bytes_ = seq->HeldBytes();
  return seq;
}

absl::Status LocalSequence::MakeEvictor(
    const std::optional<cache::eviction::SessionEvictorOptions>& eviction) {
  if (!eviction.has_value()) return absl::OkStatus();
  const model::ModelConfig& config = forward_.model().config;
  cache::eviction::SessionEvictorOptions o = *eviction;
  o.n_heads = config.n_heads;
  o.backend = &forward_.backend();
  RECALL_ASSIGN_OR_RETURN(evictor_, cache::eviction::SessionEvictor::Create(o, cache_));
  if (evictor_->steps_on_backend()) return absl::OkStatus();  // probs stay in backend memory
  if (evictor_->policy().needs_attention() ||
      o.policy.meta_score == cache::eviction::PolicyOptions::MetaScore::kCaoteCurrentQuery) {
    wants_probs_ = true;
  }
  return absl::OkStatus();
}

void LocalSequence::EnsureProbs(int len) {
  if (!wants_probs_ || probs_stride_ >= len) return;
  const model::ModelConfig& config = forward_.model().config;
  int64_t stride = std::max<int64_t>(64, probs_stride_);
  while (stride < len) stride *= 2;
  probs_stride_ = std::min<int64_t>(stride, config.max_seq_len);
  probs_.assign(static_cast<size_t>(config.n_layers) * config.n_heads * probs_stride_, 0.0f);
}

int32_t LocalSequence::context_used() const {
  return positions_ == runtime::Positions::kCompact ? cache_->max_length() : next_position();
}

bool LocalSequence::endless() const {
  return positions_ == runtime::Positions::kCompact && evictor_ != nullptr &&
         !evictor_->policy().compresses_prefill();
}

void LocalSequence::CompactTo(int32_t next) {
  runtime::CompactPositions(forward_.backend(), forward_.model().config, *cache_, next);
}

absl::Status LocalSequence::Feed(std::span<const int32_t> tokens, float* logits) {
  const int n = static_cast<int>(tokens.size());
  RECALL_RETURN_IF_ERROR(runtime::RunChunked(forward_, cache_, tokens, n, logits, nullptr, 0));
  peak_bytes_ = std::max(peak_bytes_, HeldBytes());
  return absl::OkStatus();
}

void LocalSequence::MakeRoom(int n) {
  if (group_positions_) return;
  const model::ModelConfig& config = forward_.model().config;
  if (positions_ == runtime::Positions::kCompact && runtime::NeedsCompaction(*cache_, config, n)) {
    runtime::CompactPositions(forward_.backend(), config, *cache_, cache_->max_length());
  }
}

absl::Status LocalSequence::Prefill(std::span<const int32_t> prompt, int chunk, float* logits) {
  const model::ModelConfig& config = forward_.model().config;
  const int len = static_cast<int>(prompt.size());
  if (positions_ == runtime::Positions::kCompact && !evictor_->policy().compresses_prefill()) {
    return FeedCompactPrompt(
        {.cache = *cache_,
         .evictor = evictor_.get(),
         .length = [this] { return cache_->max_length(); },
         .make_room =
             [this](int n) {
               MakeRoom(n);
               return absl::OkStatus();
             },
         .feed = [this](std::span<const int32_t> t, float* l) { return Feed(t, l); },
         .step = [this](int32_t token, float* l) { return Decode(token, l); }},
        config, prompt, chunk, logits);
  }
  // Prefill-time compression (SnapKV) scores the prompt by its last `window` queries.
  std::vector<float> window_queries;
  int window_w = 0;
  if (evictor_ != nullptr && evictor_->policy().compresses_prefill()) {
    window_w = std::min(evictor_->policy().options().window, len);
    window_queries.resize(static_cast<size_t>(config.n_layers) * window_w * config.n_heads *
                          config.head_dim);
  }
  RECALL_RETURN_IF_ERROR(runtime::RunChunked(forward_, cache_, prompt, chunk, logits,
                                             window_w > 0 ? window_queries.data() : nullptr,
                                             window_w));
  peak_bytes_ = std::max(peak_bytes_, HeldBytes());
  if (window_w > 0) return evictor_->CompressPrefill(window_queries.data(), window_w);
  return absl::OkStatus();
}

absl::Status FeedCompactPrompt(const CompactPrompt& p, const model::ModelConfig& config,
                               std::span<const int32_t> prompt, int chunk, float* logits) {
  const int len = static_cast<int>(prompt.size());
  for (int fed = 0; fed < len;) {
    bool step = false;
    const int want = std::min(chunk, len - fed);
    absl::Status room;
    absl::StatusOr<int> piece =
        runtime::NextCompactPiece(p.cache, p.length(), config, p.evictor, chunk, want, &step,
                                  [&] { room = p.make_room(want); });
    RECALL_RETURN_IF_ERROR(room);
    if (!piece.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("prompt: ", piece.status().message()));
    }
    const int n = *piece;
    if (step) {
      RECALL_RETURN_IF_ERROR(p.step(prompt[fed], logits));
    } else {
      RECALL_RETURN_IF_ERROR(p.feed(prompt.subspan(fed, n), fed + n == len ? logits : nullptr));
    }
    fed += n;
  }
  return absl::OkStatus();
}

absl::Status LocalSequence::Decode(int32_t token, float* logits) {
  MakeRoom(1);
  EnsureProbs(cache_->max_length() + 1);
  runtime::BatchItem item;
  item.cache = cache_;
  item.tokens = &token;
  item.n = 1;
  item.attn_probs = probs_.empty() ? nullptr : probs_.data();
  item.probs_stride = probs_stride_;
  item.probs_on_backend = evictor_ != nullptr && evictor_->steps_on_backend();
  RECALL_RETURN_IF_ERROR(forward_.Run({&item, 1}, logits));
  peak_bytes_ = std::max(peak_bytes_, HeldBytes());
  if (evictor_ == nullptr) return absl::OkStatus();
  if (item.probs_on_backend) {
    int64_t stride = 0;
    const float* probs = forward_.backend_probs(0, &stride);
    return evictor_->Step(probs, stride);
  }
  return evictor_->Step(item.attn_probs, probs_stride_);
}

SequenceStats LocalSequence::stats() const {
  SequenceStats s;
  s.kv_bytes = HeldBytes();
  s.peak_kv_bytes = peak_bytes_;
  if (evictor_ != nullptr) {
    s.peak_kv_bytes = std::max(s.peak_kv_bytes, evictor_->peak_kv_bytes());
    s.evictions = evictor_->evictions();
    s.evicted_slots = evictor_->evicted_slots();
  }
  return s;
}

}  // namespace recall::offline
