// AppendRows: how the evictor tests grow a cache. n tokens at the next positions, with every
// (layer, KV head)'s K and V rows filled by functions of (position, layer, head, element).
// The pool must be host memory (opaque or not): the rows are written in place.
#pragma once

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "cache/sequence_cache.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction::testing {

using RowFn = std::function<float(int pos, int layer, int head, int d)>;

inline void AppendRows(SequenceCache& seq, int n, const RowFn& k_fn, const RowFn& v_fn) {
  ASSERT_TRUE(seq.Reserve(n).ok());
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), seq.next_position());
  const kernels::PagedKv kv = seq.View();
  const kernels::PagedKvLayout& layout = kv.layout;
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      for (int i = 0; i < n; ++i) {
        float* k = kv.K(l, h, seq.length(l, h) + i);
        float* v = kv.V(l, h, seq.length(l, h) + i);
        for (int d = 0; d < layout.head_dim; ++d) {
          k[d] = k_fn(pos[static_cast<size_t>(i)], l, h, d);
          v[d] = v_fn(pos[static_cast<size_t>(i)], l, h, d);
        }
      }
    }
  }
  seq.CommitAppend(pos.data(), n);
}

}  // namespace recall::cache::eviction::testing
