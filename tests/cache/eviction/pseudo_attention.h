// Deterministic stand-in attention for evictor tests: a probability for every (layer, query
// head, slot) that depends only on the slot's token position, the step, the head and the
// layer, so two caches with the same history get the same probabilities.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/sequence_cache.h"

namespace recall::cache::eviction::testing {

// In [0, 0.1).
inline float PseudoAttention(int32_t position, int t, int qh, int layer) {
  uint32_t x = static_cast<uint32_t>(position) * 2654435761u ^
               static_cast<uint32_t>(t * 40503 + qh * 977 + layer * 131);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<float>(x % 1000) * 1e-4f;
}

// [n_layers, n_heads, stride] probabilities of `seq` at step t (GQA groups of
// n_heads / n_kv_heads); `fill` beyond each head's length.
inline std::vector<float> PseudoProbs(const SequenceCache& seq, int t, int n_heads, int stride,
                                      float fill = 0.0f) {
  const kernels::PagedKvLayout layout = seq.View().layout;
  std::vector<float> p(static_cast<size_t>(layout.n_layers) * n_heads * stride, fill);
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int qh = 0; qh < n_heads; ++qh) {
      const int kh = qh / (n_heads / layout.n_kv_heads);
      for (int s = 0; s < seq.length(l, kh); ++s) {
        p[(static_cast<size_t>(l) * n_heads + qh) * stride + s] =
            PseudoAttention(seq.position(l, kh, s), t, qh, l);
      }
    }
  }
  return p;
}

}  // namespace recall::cache::eviction::testing
