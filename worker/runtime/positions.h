// Positions of a sequence longer than the model's context length (docs/eviction.md,
// "Positions"). A session's tokens are numbered as they come; when the next token's position
// would reach the context length, a session in Positions::kCompact gets its cached tokens
// re-positioned instead of failing: every (layer, KV head) row's slots become consecutive and
// end just before the next token (the longest row starts at 0), and the keys are rotated to
// those positions (Backend::RerotateKeys). What a key attends to stays in the same order and
// the newest tokens keep their distances; older gaps left by eviction close up, as in
// StreamingLLM, so no distance the model sees exceeds the cache's length. The eviction
// clocks (steps) are not positions and do not change.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/sequence_cache.h"
#include "kernels/backend.h"
#include "worker/model/model_config.h"

namespace recall::cache::eviction {
class SessionEvictor;
}  // namespace recall::cache::eviction

namespace recall::runtime {

enum class Positions {
  kOriginal,  // absolute positions; a sequence ends at the context length
  kCompact,   // re-positioned when the context length is reached
};
const char* PositionsName(Positions positions);  // "original", "compact"

// Re-positions `cache` (resident, in `backend`'s memory) compactly, its next token at `next`
// (>= cache.max_length(); for tensor-parallel ranks the largest of their max_length()s, so
// that every rank's next token has the same position). `config` gives RoPE's theta and
// layout.
void CompactPositions(kernels::Backend& backend, const model::ModelConfig& config,
                      cache::SequenceCache& cache, int32_t next);

// Whether a sequence must be re-positioned before `n` more tokens: they would pass the
// context length.
inline bool NeedsCompaction(const cache::SequenceCache& cache, const model::ModelConfig& config,
                            int n) {
  return cache.next_position() + n > config.max_seq_len;
}

// How many of a compact session's prompt tokens go into its next piece, `n` being the piece
// it would feed (at most one chunk): n while the cache (`length` tokens, its longest row)
// stays within the evictor's largest budget, its window and one chunk, cut so that the
// context keeps room for the evictor's lag and one step; else 1 with *step set: one token per
// step, each followed by an eviction step (prompt pieces do not evict). Then a session whose
// budget + lag + 1 fit the context (CacheFactory refuses others) never fills it. `evictor`
// must step (not a policy that compresses only at prefill).
int CompactPiece(int length, cache::eviction::SessionEvictor& evictor, int context, int chunk,
                 int n, bool* step);

// The piece a compact sequence feeds next, `n` being the piece it would feed and `length`
// its longest row (over every rank's cache under TP; `cache` positions them): for prompt
// tokens of a sequence whose evictor steps (`stepping` non-null), CompactPiece's; then, when
// the piece would pass the context, `compact` re-positions the cache (CompactPositions), and
// if that is not enough a stepping sequence feeds one token with *step set. FailedPrecondition
// when even that fills the context: its policy does not evict enough to go on. Shared by the
// scheduler and the offline sequence, so both go on (and stop) alike.
absl::StatusOr<int> NextCompactPiece(const cache::SequenceCache& cache, int length,
                                     const model::ModelConfig& config,
                                     cache::eviction::SessionEvictor* stepping, int chunk, int n,
                                     bool* step, absl::FunctionRef<void()> compact);

}  // namespace recall::runtime
