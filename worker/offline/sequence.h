// Sequence: one sequence's run through the model (its KV cache, its evictor and the forward
// pass that appends to them) behind one interface, so that Generate drives a single backend
// (LocalSequence) and a tensor-parallel group (tp::TpSequence) alike.
//
// Not thread safe: one caller drives a sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "worker/runtime/forward.h"
#include "worker/runtime/positions.h"

namespace recall::offline {

struct SequenceStats {
  // Bytes held for the cache: KV and the eviction policy's per-slot state
  // (SessionEvictor::held_bytes()), all ranks.
  int64_t kv_bytes = 0;       // now
  int64_t peak_kv_bytes = 0;  // the most at any point: after prefill or a step's append
  int64_t evictions = 0;      // (layer, KV head) compactions (all ranks)
  int64_t evicted_slots = 0;  // slots evicted (all ranks)
};

// Feeds a prompt to a sequence with compact positions whose policy evicts as it goes (an
// endless one): pieces of at most `chunk` while the cache (`length()`, its longest row) stays
// within the evictor's largest budget, its window and one chunk, else one token per step with
// an eviction step after it (runtime::NextCompactPiece), the cache re-positioned first when a
// piece would pass the context (`make_room(n)`). LocalSequence runs it on its cache, TpSequence
// once for its ranks (their longest row). `feed` runs a piece, `step` one token as a decode
// step; each gets `logits` for the prompt's last token only.
struct CompactPrompt {
  const cache::SequenceCache& cache;  // the next position's (the same on every rank)
  cache::eviction::SessionEvictor* evictor;
  std::function<int32_t()> length;
  std::function<absl::Status(int n)> make_room;
  std::function<absl::Status(std::span<const int32_t> tokens, float* logits)> feed;
  std::function<absl::Status(int32_t token, float* logits)> step;
};
absl::Status FeedCompactPrompt(const CompactPrompt& p, const model::ModelConfig& config,
                               std::span<const int32_t> prompt, int chunk, float* logits);

class Sequence {
 public:
  virtual ~Sequence() = default;
  // Runs the whole prompt (non-empty) in forward passes of at most `chunk` tokens and then,
  // for a prefill-time policy (SnapKV), compresses it. logits: [vocab] of the last token.
  virtual absl::Status Prefill(std::span<const int32_t> prompt, int chunk, float* logits) = 0;
  // Appends one token, then takes one eviction step. logits: [vocab] of that token.
  virtual absl::Status Decode(int32_t token, float* logits) = 0;
  // The next token's position.
  virtual int32_t next_position() const = 0;
  // How much of the model's context the sequence takes: its next position, or for one that
  // re-positions its cache (runtime/positions.h), the tokens the cache holds.
  virtual int32_t context_used() const { return next_position(); }
  // Whether the sequence goes on past the model's context length whatever it is fed: it
  // re-positions its cache and its policy evicts as tokens are fed. (One that compresses only
  // its first prompt, SnapKV, re-positions too but ends once its cache holds the context.)
  virtual bool endless() const { return false; }
  virtual SequenceStats stats() const = 0;
};

// A sequence on one ForwardPass and one BlockPool (or one rank of a tensor-parallel group:
// then the ForwardPass has the rank's communicator and so must the evictor options).
class LocalSequence final : public Sequence {
 public:
  // `eviction` unset means the full cache; its n_heads is set from the forward pass's model.
  // InvalidArgument for bad eviction options. forward and pool must outlive the sequence.
  // `positions` kCompact (with an eviction policy) makes the sequence endless: at the context
  // length its cache is re-positioned, and a prompt that would grow the cache past its budget,
  // its window and one `chunk` is fed one token per step, each followed by an eviction step
  // (as the scheduler does).
  static absl::StatusOr<std::unique_ptr<LocalSequence>> Create(
      runtime::ForwardPass& forward, cache::BlockPool& pool,
      const std::optional<cache::eviction::SessionEvictorOptions>& eviction,
      runtime::Positions positions = runtime::Positions::kOriginal);
  // The same on a cache the caller owns and that may already hold tokens (an EpiCache
  // episode): Prefill appends to it, the evictor takes over all of it. The cache must
  // outlive the sequence and be resident.
  static absl::StatusOr<std::unique_ptr<LocalSequence>> CreateOn(
      runtime::ForwardPass& forward, cache::SequenceCache* cache,
      const std::optional<cache::eviction::SessionEvictorOptions>& eviction);

  absl::Status Prefill(std::span<const int32_t> prompt, int chunk, float* logits) override;
  absl::Status Decode(int32_t token, float* logits) override;
  int32_t next_position() const override { return cache_->next_position(); }
  int32_t context_used() const override;
  bool endless() const override;
  SequenceStats stats() const override;

  const cache::SequenceCache& cache() const { return *cache_; }
  // Null for the full cache.
  const cache::eviction::SessionEvictor* evictor() const { return evictor_.get(); }

 private:
  friend class TpSequence;  // drives its ranks' compact positions as one (tp_sequence.h)
  LocalSequence(runtime::ForwardPass& forward, std::unique_ptr<cache::SequenceCache> owned,
                cache::SequenceCache* cache);
  // Re-positions the cache so that its next token is at `next` (>= its longest row).
  void CompactTo(int32_t next);
  // Runs `tokens` in one forward pass (no re-positioning, no eviction step).
  absl::Status Feed(std::span<const int32_t> tokens, float* logits);
  absl::Status MakeEvictor(const std::optional<cache::eviction::SessionEvictorOptions>& eviction);
  // Grows probs_ so each head's row holds `len` slots (bounded by the cache, not the context).
  void EnsureProbs(int len);
  // Re-positions the cache when `n` more tokens would pass the context (endless only).
  void MakeRoom(int n);

  runtime::ForwardPass& forward_;
  std::unique_ptr<cache::SequenceCache> owned_;  // null when the caller owns the cache
  cache::SequenceCache* cache_;
  std::unique_ptr<cache::eviction::SessionEvictor> evictor_;
  std::vector<float> probs_;  // [n_layers, n_heads, probs_stride_] when the policy needs them
  int64_t probs_stride_ = 0;
  bool wants_probs_ = false;
  runtime::Positions positions_ = runtime::Positions::kOriginal;
  // A TP rank: its group re-positions it (TpSequence::MakeRoom), never the rank alone (to its
  // own longest row, which would part the ranks' positions).
  bool group_positions_ = false;
  // The cache's bytes and the eviction state's (SessionEvictor::held_bytes()).
  int64_t HeldBytes() const {
    return evictor_ != nullptr ? evictor_->held_bytes() : cache_->bytes_held();
  }
  int64_t peak_bytes_ = 0;
};

}  // namespace recall::offline
