// KvBatch: one forward step's attention work over a batch of sequences that share one block
// pool, described by flat arrays the forward pass writes once per step. Backends read it in
// one launch per layer (Backend::StoreKvBatch / AttentionBatch) instead of one per sequence.
//
// Item i owns tokens [token_begin[i], token_begin[i + 1]) of the step's rows (q, k, v, out
// are [total_tokens, heads, head_dim]). For layer l and KV head h of item i (index
// ilh = (i * n_layers + l) * n_kv_heads + h):
//   kv_start[ilh]  slots the head held before this step (StoreKvBatch appends from there;
//                  attention of the item's j-th new token covers slots [0, kv_start + j]);
// and for layer l of item i (index il = i * n_layers + l):
//   tables[table_begin[il] .. + table_count[il]) the layer's block ids.
// probs (optional): for a decode item (one token) whose probs[i] is not null, AttentionBatch
// writes the softmax probabilities of query head qh of layer l to
//   probs[i][(l * n_heads + qh) * probs_stride[i] + s], s < its KV head's length after the step.
//
// Every pointer is in backend memory (kernels/memory.h) except the `host_` copies, which the
// forward pass keeps for backends that loop on the host.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace recall::kernels {

struct KvBatch {
  PagedKvLayout layout;
  void* pool = nullptr;  // bytes laid out as `layout` says
  int n_items = 0;
  int total_tokens = 0;
  int max_new_tokens = 0;  // the largest item's token count (1 for a decode-only batch)
  int max_kv_len = 0;      // the longest (item, layer, head) after the step

  const int32_t* token_begin = nullptr;  // [n_items + 1]
  const int32_t* token_item = nullptr;   // [total_tokens]: the item each row belongs to
  const int32_t* kv_start = nullptr;     // [n_items * n_layers * n_kv_heads]
  const int32_t* table_begin = nullptr;  // [n_items * n_layers]
  const int32_t* table_count = nullptr;  // [n_items * n_layers]
  const int32_t* tables = nullptr;
  float* const* probs = nullptr;         // [n_items] or null when no item wants them
  const int64_t* probs_stride = nullptr; // [n_items]

  // Host copies of the arrays above (same layout).
  const int32_t* host_token_begin = nullptr;
  const int32_t* host_kv_start = nullptr;
  const int32_t* host_table_begin = nullptr;
  const int32_t* host_table_count = nullptr;
  const int32_t* host_tables = nullptr;
  float* const* host_probs = nullptr;  // backend-memory pointers, listed on the host
  const int64_t* host_probs_stride = nullptr;
};

}  // namespace recall::kernels
