#include "worker/offline/tp_sequence.h"

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
    const std::optional<cache::eviction::SessionEvictorOptions>& eviction) {
  std::unique_ptr<TpSequence> seq(new TpSequence(group));
  for (int r = 0; r < group.tp(); ++r) {
    std::optional<cache::eviction::SessionEvictorOptions> o;
    if (eviction.has_value()) o = RankEvictorOptions(group, r, *eviction);
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<LocalSequence> rank,
                            LocalSequence::Create(group.forward(r), group.pool(r), o));
    seq->ranks_.push_back(std::move(rank));
  }
  return seq;
}

absl::Status TpSequence::Prefill(std::span<const int32_t> prompt, int chunk, float* logits) {
  return group_.Run([&](int r) {
    return ranks_[static_cast<size_t>(r)]->Prefill(prompt, chunk, r == 0 ? logits : nullptr);
  });
}

absl::Status TpSequence::Decode(int32_t token, float* logits) {
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
