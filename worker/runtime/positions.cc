#include "worker/runtime/positions.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/eviction/session_evictor.h"
#include "common/logging.h"

namespace recall::runtime {

const char* PositionsName(Positions positions) {
  return positions == Positions::kCompact ? "compact" : "original";
}

void CompactPositions(kernels::Backend& backend, const model::ModelConfig& config,
                      cache::SequenceCache& cache, int32_t next) {
  const kernels::PagedKv kv = cache.View();
  const int rows = kv.layout.n_layers * kv.layout.n_kv_heads;
  const int64_t stride = std::max(1, cache.max_length());
  RECALL_CHECK(next >= cache.max_length()) << "next " << next << " < " << cache.max_length();
  std::vector<int32_t> from(static_cast<size_t>(rows * stride)), to(from.size()), lens(rows);
  cache.Positions(from.data(), stride);
  for (int r = 0; r < rows; ++r) {
    lens[r] = cache.length(r / kv.layout.n_kv_heads, r % kv.layout.n_kv_heads);
    for (int s = 0; s < lens[r]; ++s) to[r * stride + s] = next - lens[r] + s;
  }
  kernels::RerotateArgs a;
  a.kv = kv;
  a.lens = lens.data();
  a.from = from.data();
  a.to = to.data();
  a.stride = stride;
  a.theta = config.rope_theta;
  a.style = config.rope_style;
  backend.RerotateKeys(a);
  cache.MovePositions(to.data(), stride, next);
}

int CompactPiece(int length, cache::eviction::SessionEvictor& evictor, int context, int chunk,
                 int n, bool* step) {
  const int cap = evictor.MaxBudget() + evictor.policy().options().window + chunk;
  const int room = context - evictor.policy().eviction_lag() - 1 - length;
  if (length + n > cap || room < 1) {
    *step = true;
    return 1;
  }
  return std::min(n, room);
}

absl::StatusOr<int> NextCompactPiece(const cache::SequenceCache& cache, int length,
                                     const model::ModelConfig& config,
                                     cache::eviction::SessionEvictor* stepping, int chunk, int n,
                                     bool* step, absl::FunctionRef<void()> compact) {
  *step = false;
  if (stepping != nullptr) {
    n = CompactPiece(length, *stepping, config.max_seq_len, chunk, n, step);
  }
  if (NeedsCompaction(cache, config, n)) {
    compact();
    if (NeedsCompaction(cache, config, n) && stepping != nullptr) {
      n = 1;
      *step = true;
    }
    if (NeedsCompaction(cache, config, n)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the cache holds ", length, " tokens, which with ", n,
                       " more fill the model's context length (", config.max_seq_len,
                       "); its policy does not evict enough to go on"));
    }
  }
  return n;
}

}  // namespace recall::runtime
