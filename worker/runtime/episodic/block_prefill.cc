#include "worker/runtime/episodic/block_prefill.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/episodic/patch_scores.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/kv_rows.h"

namespace recall::runtime::episodic {
namespace {

absl::Status Validate(const ForwardPass& forward, std::span<const int32_t> patch,
                      std::span<const int32_t> budgets, const BlockPrefillOptions& o) {
  const int n_layers = forward.model().config.n_layers;
  if (patch.empty()) return absl::InvalidArgumentError("patch: needs at least one token");
  if (o.block_tokens <= static_cast<int>(patch.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_tokens: ", o.block_tokens, " must exceed the patch's ", patch.size(), " tokens"));
  }
  if (o.chunk < 1 || o.chunk > forward.max_batch_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: ", o.chunk, " not in [1, ", forward.max_batch_tokens(), "]"));
  }
  if (static_cast<int>(budgets.size()) != n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("budgets: expected ", n_layers, " (one per layer), got ", budgets.size()));
  }
  for (size_t l = 0; l < budgets.size(); ++l) {
    if (budgets[l] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("budgets[", l, "]: ", budgets[l], " must be >= 1"));
    }
  }
  return absl::OkStatus();
}

void Observe(const cache::SequenceCache& cache, BlockPrefillStats* stats) {
  stats->peak_bytes = std::max(stats->peak_bytes, cache.bytes_held());
  stats->max_layer_slots = std::max(stats->max_layer_slots, cache.max_length());
}

// Scores and compacts every layer of `cache` (the patch's p slots at the end of every head)
// to its budget, dropping the patch's slots.
class Compressor {
 public:
  Compressor(const model::ModelConfig& c, cache::SequenceCache* cache, bool head_adaptive)
      : c_(c),
        cache_(cache),
        head_adaptive_(head_adaptive),
        scale_(1.0f / std::sqrt(static_cast<float>(c.head_dim))),
        scores_(static_cast<size_t>(c.n_kv_heads)),
        keeps_(static_cast<size_t>(c.n_kv_heads)) {}

  // queries: [n_layers, p, n_heads, head_dim].
  int64_t Run(const float* queries, int p, std::span<const int32_t> budgets) {
    int64_t evicted = 0;
    const int group = c_.n_heads / c_.n_kv_heads;
    const kernels::PagedKv kv = cache_->View();
    for (int l = 0; l < c_.n_layers; ++l) {
      const float* layer_q = queries + static_cast<int64_t>(l) * p * c_.n_heads * c_.head_dim;
      std::vector<int> bases(static_cast<size_t>(c_.n_kv_heads));
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        const int len = cache_->length(l, h);
        const int base = len - p;
        bases[h] = base;
        keys_.resize(static_cast<size_t>(len) * c_.head_dim);
        const kernels::PagedKvHead rows = kv.Head(l, h);
        for (int j = 0; j < len; ++j) {
          kernels::LoadKvRow(rows, 0, j, keys_.data() + static_cast<size_t>(j) * c_.head_dim);
        }
        scores_[h].resize(static_cast<size_t>(base));
        cache::episodic::PatchScores(keys_.data(), base, layer_q, p, c_.n_heads, h * group, group,
                                     c_.head_dim, scale_, &logits_, scores_[h].data());
      }
      if (head_adaptive_) {
        std::vector<const float*> ptrs;
        for (const std::vector<float>& s : scores_) ptrs.push_back(s.data());
        cache::episodic::KeepTopAcrossHeads(
            ptrs, bases, static_cast<int64_t>(budgets[l]) * c_.n_kv_heads, &keeps_);
      } else {
        for (int h = 0; h < c_.n_kv_heads; ++h) {
          cache::episodic::KeepTop(scores_[h].data(), bases[h], budgets[l], &order_, &keeps_[h]);
        }
      }
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        evicted += bases[h] - static_cast<int64_t>(keeps_[h].size());
        cache_->Compact(l, h, keeps_[h]);
      }
    }
    cache_->TrimBlocks();
    return evicted;
  }

 private:
  const model::ModelConfig& c_;
  cache::SequenceCache* cache_;
  const bool head_adaptive_;
  const float scale_;
  std::vector<float> keys_;
  std::vector<double> logits_;
  std::vector<int32_t> order_;
  std::vector<std::vector<float>> scores_;
  std::vector<std::vector<int32_t>> keeps_;
};

// Whether some layer holds more slots than its budget allows (per head, or summed over the
// heads when head-adaptive).
bool OverBudget(const cache::SequenceCache& cache, int n_kv_heads, std::span<const int32_t> budgets,
                bool head_adaptive) {
  for (size_t l = 0; l < budgets.size(); ++l) {
    int64_t sum = 0;
    for (int h = 0; h < n_kv_heads; ++h) {
      const int len = cache.length(static_cast<int>(l), h);
      if (!head_adaptive && len > budgets[l]) return true;
      sum += len;
    }
    if (head_adaptive && sum > static_cast<int64_t>(budgets[l]) * n_kv_heads) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<BlockPrefillStats> BlockwisePrefill(ForwardPass& forward,
                                                   cache::SequenceCache* cache,
                                                   std::span<const int32_t> history,
                                                   std::span<const int32_t> patch,
                                                   std::span<const int32_t> budgets,
                                                   const BlockPrefillOptions& options) {
  RECALL_RETURN_IF_ERROR(Validate(forward, patch, budgets, options));
  if (!cache->host_readable()) {
    return absl::FailedPreconditionError(
        "block-wise prefill scores keys on the host; this cache's pool is device memory");
  }
  const model::ModelConfig& c = forward.model().config;
  const int p = static_cast<int>(patch.size());
  const size_t step = static_cast<size_t>(options.block_tokens - p);
  std::vector<float> queries(static_cast<size_t>(c.n_layers) * p * c.n_heads * c.head_dim);
  Compressor compressor(c, cache, options.head_adaptive);
  BlockPrefillStats stats;
  Stopwatch total;
  for (size_t start = 0; start < history.size(); start += step) {
    const std::span<const int32_t> block =
        history.subspan(start, std::min(step, history.size() - start));
    if (options.positions == Positions::kCompact &&
        NeedsCompaction(*cache, c, static_cast<int>(block.size()) + p)) {
      CompactPositions(forward.backend(), c, *cache, cache->max_length());
      ++stats.compactions;
      if (NeedsCompaction(*cache, c, static_cast<int>(block.size()) + p)) {
        return absl::OutOfRangeError(absl::StrCat(
            "history: the cache's ", cache->max_length(), " tokens and a block of ",
            block.size() + p, " (with the patch) exceed the context length ", c.max_seq_len,
            " even re-positioned (budget + block_tokens must fit in it)"));
      }
    }
    RECALL_RETURN_IF_ERROR(RunChunked(forward, cache, block, options.chunk, nullptr));
    ++stats.blocks;
    Observe(*cache, &stats);
    if (!OverBudget(*cache, c.n_kv_heads, budgets, options.head_adaptive)) continue;
    // The patch runs right after the history so far; near the end of the context only its
    // last tokens fit.
    const int32_t resume = cache->next_position();
    const int room = std::min(p, c.max_seq_len - resume);
    if (room < 1) {
      return absl::OutOfRangeError(absl::StrCat("history: ", resume,
                                                " tokens leave no room in the context of ",
                                                c.max_seq_len, " for the patch queries"));
    }
    RECALL_RETURN_IF_ERROR(
        RunChunked(forward, cache, patch.last(room), options.chunk, nullptr, queries.data(), room));
    Observe(*cache, &stats);
    Stopwatch scoring;
    stats.evicted_slots += compressor.Run(queries.data(), room, budgets);
    stats.score_seconds += scoring.ElapsedSeconds();
    cache->SetNextPosition(resume);
    ++stats.scored_blocks;
  }
  stats.seconds = total.ElapsedSeconds();
  return stats;
}

}  // namespace recall::runtime::episodic
