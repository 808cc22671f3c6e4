// The default Backend::StoreKvBatch / AttentionBatch: a host loop over the batch's items
// through the per-sequence ops (what the CPU backend uses; GPU backends override them).
#include <algorithm>

#include "kernels/backend.h"

namespace recall::kernels {

PagedKv Backend::ItemView(const KvBatch& b, int item, int layer) {
  const int n_layers = b.layout.n_layers;
  item_tables_.assign(static_cast<size_t>(n_layers), nullptr);
  item_counts_.assign(static_cast<size_t>(n_layers), 0);
  const int il = item * n_layers + layer;
  item_tables_[static_cast<size_t>(layer)] = b.host_tables + b.host_table_begin[il];
  item_counts_[static_cast<size_t>(layer)] = b.host_table_count[il];
  PagedKv kv;
  kv.layout = b.layout;
  kv.pool = b.pool;
  kv.block_tables = item_tables_.data();
  kv.block_counts = item_counts_.data();
  return kv;
}

void Backend::StoreKvBatch(const KvBatch& b, int layer, const float* k, const float* v) {
  const int kv_dim = b.layout.n_kv_heads * b.layout.head_dim;
  for (int i = 0; i < b.n_items; ++i) {
    const int t0 = b.host_token_begin[i];
    const int n = b.host_token_begin[i + 1] - t0;
    const PagedKv kv = ItemView(b, i, layer);
    const int32_t* start =
        b.host_kv_start + (static_cast<size_t>(i) * b.layout.n_layers + layer) * b.layout.n_kv_heads;
    StoreKv(kv, layer, k + static_cast<size_t>(t0) * kv_dim, v + static_cast<size_t>(t0) * kv_dim,
            n, start);
  }
}

void Backend::AttentionBatch(const KvBatch& b, int layer, const float* q, int n_heads,
                             float scale, float* out) {
  const int q_dim = n_heads * b.layout.head_dim;
  const int n_kv = b.layout.n_kv_heads;
  item_lens_.resize(static_cast<size_t>(n_kv));
  for (int i = 0; i < b.n_items; ++i) {
    const int t0 = b.host_token_begin[i];
    const int n = b.host_token_begin[i + 1] - t0;
    const PagedKv kv = ItemView(b, i, layer);
    const int32_t* start = b.host_kv_start + (static_cast<size_t>(i) * b.layout.n_layers + layer) * n_kv;
    for (int h = 0; h < n_kv; ++h) item_lens_[static_cast<size_t>(h)] = start[h] + n;
    const float* qi = q + static_cast<size_t>(t0) * q_dim;
    float* oi = out + static_cast<size_t>(t0) * q_dim;
    if (n == 1) {
      float* probs = b.host_probs == nullptr ? nullptr : b.host_probs[i];
      const int64_t stride = probs == nullptr ? 0 : b.host_probs_stride[i];
      if (probs != nullptr) probs += static_cast<int64_t>(layer) * n_heads * stride;
      DecodeAttention(kv, layer, item_lens_.data(), qi, n_heads, scale, oi, probs, stride);
    } else {
      PrefillAttention(kv, layer, item_lens_.data(), qi, n, n_heads, scale, oi);
    }
  }
}

}  // namespace recall::kernels
