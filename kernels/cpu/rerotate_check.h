// CheckRerotate: a quick check, run when a backend is created, that its key re-rotation
// (Backend::RerotateKeys) moves keys as the host reference does, on a small paged cache in the
// backend's memory: four rows over shuffled blocks, keys moved down from past 20,000 and up,
// both RoPE layouts. A backend whose kernel has never run on its hardware then falls back to
// the host (the CUDA backend does) instead of attending to wrongly rotated keys.
// CompareRerotate runs any such case (the CUDA tests run larger ones).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::kernels {

// One RerotateKeys call on a cache held on the host.
struct RerotateCase {
  PagedKvLayout layout;
  std::vector<std::vector<int32_t>> tables;  // [n_layers] block ids
  std::vector<float> pool;                   // the block pool
  std::vector<int32_t> lens;                 // [n_layers * n_kv_heads]
  std::vector<int32_t> from, to;             // [n_layers * n_kv_heads, stride]
  int64_t stride = 0;
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::kInterleaved;
};

// Runs the case on `backend` (copied to its memory) and on the host reference: OK when every
// moved key is within 1e-5 (relative, per row) of the reference and every other float of the
// pool is unchanged; InternalError naming the first difference, or the backend's own error.
absl::Status CompareRerotate(Backend& backend, const RerotateCase& c);

// A case of `rows_per_layer`-slot rows (4 rows: 2 layers x 2 KV heads) with head_dim
// `head_dim`, keys at random positions; `seed` draws them.
RerotateCase MakeRerotateCase(int head_dim, RopeStyle style, int max_len, uint32_t seed);

// CompareRerotate on two built-in cases (head_dim 64 and 128, both layouts).
absl::Status CheckRerotate(Backend& backend);

}  // namespace recall::kernels
