#include "worker/offline/tp_sequence.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::offline {

cache::eviction::SessionEvictorOptions RankEvictorOptions(
    runtime::tp::TpGroup& group, int r, const cache::eviction::SessionEvictorOptions& base) {
  cache::eviction::SessionEvictorOptions o = base;
  o.comm = group.tp() > 1 ? &group.comm(r) : nullptr;
  o.kv_head_offset = group.layout(r).kv_head_offset;
  o.total_kv_heads = group.full_model().config.n_kv_heads;
  return o;
}

absl::StatusOr<std::unique_ptr<TpSequence>> TpSequence::Create(
    runtime::tp::TpGroup& group,
    const std::optional<cache::eviction::SessionEvictorOptions>& eviction,
    runtime::Positions positions) {
  std::unique_ptr<TpSequence> seq(new TpSequence(group));
  for (int r = 0; r < group.tp(); ++r) {
    std::optional<cache::eviction::SessionEvictorOptions> o;
    if (eviction.has_value()) o = RankEvictorOptions(group, r, *eviction);
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<LocalSequence> rank,
                            LocalSequence::Create(group.forward(r), group.pool(r), o, positions));
    rank->group_positions_ = true;
    seq->ranks_.push_back(std::move(rank));
  }
  return seq;
}

int32_t TpSequence::MaxLength() const {
  int32_t longest = 0;
  for (const auto& rank : ranks_) longest = std::max(longest, rank->cache().max_length());
  return longest;
}

int32_t TpSequence::context_used() const { return compact() ? MaxLength() : next_position(); }

absl::Status TpSequence::MakeRoom(int n) {
  if (!compact() || !runtime::NeedsCompaction(ranks_[0]->cache(), group_.full_model().config, n)) {
    return absl::OkStatus();
  }
  const int32_t next = MaxLength();
  return group_.Run([&](int r) {
    ranks_[static_cast<size_t>(r)]->CompactTo(next);
    return absl::OkStatus();
  });
}

absl::Status TpSequence::Prefill(std::span<const int32_t> prompt, int chunk, float* logits) {
  LocalSequence& first = *ranks_[0];
  if (!endless()) {
    return group_.Run([&](int r) {
      return ranks_[static_cast<size_t>(r)]->Prefill(prompt, chunk, r == 0 ? logits : nullptr);
    });
  }
  // As LocalSequence::Prefill, decided once for the group (see the top).
  return FeedCompactPrompt({.cache = first.cache(),
                            .evictor = first.evictor_.get(),
                            .length = [this] { return MaxLength(); },
                            .make_room = [this](int n) { return MakeRoom(n); },
                            .feed =
                                [this](std::span<const int32_t> tokens, float* l) {
                                  return group_.Run([&](int r) {
                                    return ranks_[static_cast<size_t>(r)]->Feed(
                                        tokens, r == 0 ? l : nullptr);
                                  });
                                },
                            .step = [this](int32_t token, float* l) { return Decode(token, l); }},
                           group_.full_model().config, prompt, chunk, logits);
}

absl::Status TpSequence::Decode(int32_t token, float* logits) {
  RECALL_RETURN_IF_ERROR(MakeRoom(1));
  return group_.Run([&](int r) {
    return ranks_[static_cast<size_t>(r)]->Decode(token, r == 0 ? logits : nullptr);
  });
}

SequenceStats TpSequence::stats() const {
  SequenceStats total;
  for (const auto& rank : ranks_) {
    const SequenceStats s = rank->stats();
    total.kv_bytes += s.kv_bytes;
    total.peak_kv_bytes += s.peak_kv_bytes;
    total.evictions += s.evictions;
    total.evicted_slots += s.evicted_slots;
  }
  return total;
}

}  // namespace recall::offline
