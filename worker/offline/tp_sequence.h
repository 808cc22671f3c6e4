// TpSequence: one sequence on a TpGroup. Every rank holds its own LocalSequence (its KV
// heads' cache and evictor, with the rank's communicator); Prefill and Decode run on all
// ranks at once through runtime::tp::TpGroup::Run, and only rank 0 produces logits. The caller
// samples once (rank 0's backend) and hands the token to every rank with the next Decode: the
// request-level decision is made once for the group. So is a compact sequence's (positions
// kCompact, runtime/positions.h): how much of a prompt goes into a piece, when to step, and
// where the re-positioned caches go on are decided from the longest row of all ranks' caches,
// between the group's runs (its ranks' lengths differ where they evict apart), so every rank
// runs the same passes at the same positions. (Each rank decided alone, the sequence ended at
// the context: `recall generate --tp 2` stopped at 508 tokens where --tp 1 went on.)
//
// Not thread safe, like every Sequence.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/eviction/session_evictor.h"
#include "worker/offline/sequence.h"
#include "worker/runtime/tp/tp_group.h"

namespace recall::offline {

class TpSequence final : public Sequence {
 public:
  // `eviction` as for LocalSequence; each rank's copy gets the rank's communicator (tp > 1),
  // kv_head_offset and the model's total_kv_heads. The group must outlive the sequence.
  static absl::StatusOr<std::unique_ptr<TpSequence>> Create(
      runtime::tp::TpGroup& group,
      const std::optional<cache::eviction::SessionEvictorOptions>& eviction,
      runtime::Positions positions = runtime::Positions::kOriginal);

  absl::Status Prefill(std::span<const int32_t> prompt, int chunk, float* logits) override;
  absl::Status Decode(int32_t token, float* logits) override;
  int32_t next_position() const override { return ranks_[0]->next_position(); }
  int32_t context_used() const override;
  bool endless() const override { return ranks_[0]->endless(); }
  SequenceStats stats() const override;  // bytes and evictions summed over the ranks

  const LocalSequence& rank(int r) const { return *ranks_[static_cast<size_t>(r)]; }

 private:
  explicit TpSequence(runtime::tp::TpGroup& group) : group_(group) {}
  bool compact() const { return ranks_[0]->positions_ == runtime::Positions::kCompact; }
  // The longest row of all ranks' caches (read between runs: the ranks are idle then).
  int32_t MaxLength() const;
  // Re-positions every rank's cache to go on at MaxLength() when `n` more tokens would pass
  // the context (compact only).
  absl::Status MakeRoom(int n);
  runtime::tp::TpGroup& group_;
  std::vector<std::unique_ptr<LocalSequence>> ranks_;
};

// Rank r's evictor options: `base` with the rank's communicator (none when tp = 1), its first
// KV head and the model's KV head count.
cache::eviction::SessionEvictorOptions RankEvictorOptions(
    runtime::tp::TpGroup& group, int r, const cache::eviction::SessionEvictorOptions& base);

}  // namespace recall::offline
