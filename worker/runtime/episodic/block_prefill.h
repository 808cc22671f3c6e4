// BlockwisePrefill: read a long history into one sequence's cache in blocks, compressing it
// to per-layer budgets after every block with an episode's patched prompt as the judge
// (EpiCache, EVICTION.md section 2, step 5).
//
// For each block: the next `block_tokens - P` history tokens are prefilled (P = the patch's
// length); if some layer then holds more slots than its budget, the patch is run as extra
// queries (appended, its queries captured after RoPE), every cached history slot is scored by
// the max softmax probability over the patch queries and the G query heads of its KV head
// (cache/episodic/patch_scores.h), each (layer, KV head) keeps its budget_l best slots (or,
// head-adaptive, the layer keeps budget_l * n_kv_heads over all its heads), the patch's slots
// are compacted away too and the position is rewound to where the patch began, so the patch
// is never part of the cache and the next block continues the history's positions.
//
// Memory: the cache never holds more than budget_l + block_tokens slots in layer l (history
// block and patch together fit in one block), whatever the history's length; with compact
// positions neither do the positions pass the context, however long the history. The cache must
// be host-readable (the CPU backend's pool): the scores are computed on the host.
//
// Not thread safe: one caller drives a forward pass and a cache.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "cache/sequence_cache.h"
#include "worker/runtime/forward.h"
#include "worker/runtime/positions.h"

namespace recall::runtime::episodic {

struct BlockPrefillOptions {
  // History and patch tokens per block (EpiCache uses 2048); must exceed the patch's length.
  int block_tokens = 2048;
  // Tokens per forward pass, <= the forward pass's max_batch_tokens.
  int chunk = 256;
  // One top-(budget_l * n_kv_heads) per layer over all KV heads instead of budget_l per head.
  bool head_adaptive = false;
  // kCompact: a history longer than the context is read too; before a block (and its patch)
  // would pass the context length, the cache is re-positioned (positions.h). Needs the
  // largest budget plus block_tokens within the context (OutOfRange otherwise, when it
  // comes to it).
  Positions positions = Positions::kOriginal;
};

struct BlockPrefillStats {
  int blocks = 0;             // history blocks read
  int scored_blocks = 0;      // blocks after which the patch ran and the cache was evicted
  int64_t peak_bytes = 0;     // the most KV bytes the cache held
  int max_layer_slots = 0;    // the most slots any (layer, head) held
  int64_t evicted_slots = 0;  // history slots evicted, over all (layer, head)
  int compactions = 0;        // re-positionings (Positions::kCompact)
  double seconds = 0;         // in all
  double score_seconds = 0;   // of which scoring and selection on the host
};

// Appends `history` (the first block may start on an empty cache or after earlier tokens)
// compressed to budgets[l] slots per (layer, KV head), judged by `patch`. The cache ends
// with at most budgets[l] slots per head of layer l, its next position after the history.
// InvalidArgument naming the argument for an empty patch, a block that does not exceed the
// patch, budgets not one positive value per layer, or a chunk above the forward pass's
// batch; FailedPrecondition if the cache is not host-readable; the forward pass's errors
// (context length, pool exhausted) otherwise.
absl::StatusOr<BlockPrefillStats> BlockwisePrefill(ForwardPass& forward,
                                                   cache::SequenceCache* cache,
                                                   std::span<const int32_t> history,
                                                   std::span<const int32_t> patch,
                                                   std::span<const int32_t> budgets,
                                                   const BlockPrefillOptions& options);

}  // namespace recall::runtime::episodic
