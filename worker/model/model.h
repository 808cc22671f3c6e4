// A loaded model: its config and views of its weights, plus the memory that backs them.
// Matrix weights keep the dtype of the file (f32, f16 or bf16); norm weights and biases are
// always fp32 (loaders convert them). Immutable after loading; safe to share across threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "worker/model/model_config.h"

namespace recall::model {

struct LayerWeights {
  kernels::Matrix attn_norm;  // [1, dim] f32
  kernels::Matrix wq;         // [n_heads * head_dim, dim]
  kernels::Matrix wk;         // [n_kv_heads * head_dim, dim]
  kernels::Matrix wv;         // [n_kv_heads * head_dim, dim]
  kernels::Matrix wo;         // [dim, n_heads * head_dim]
  kernels::Matrix bq, bk, bv; // [1, out] f32; empty unless config.qkv_bias
  kernels::Matrix q_norm;     // [1, head_dim] f32; empty unless config.qk_norm
  kernels::Matrix k_norm;     // [1, head_dim] f32; empty unless config.qk_norm
  kernels::Matrix ffn_norm;   // [1, dim] f32
  kernels::Matrix w_gate;     // [hidden_dim, dim]  (llama2.c w1)
  kernels::Matrix w_up;       // [hidden_dim, dim]  (llama2.c w3)
  kernels::Matrix w_down;     // [dim, hidden_dim]  (llama2.c w2)
};

// Owns a byte range (a heap buffer or a read-only file mapping).
class Storage {
 public:
  virtual ~Storage() = default;
  virtual const void* data() const = 0;
  virtual size_t size() const = 0;
  // The bytes [begin, begin + bytes) (inside this storage) are not read again: the storage may
  // give the whole pages among them back to the system (a file mapping's pages are dropped, a
  // heap buffer's become zero pages). The default keeps them.
  virtual void Discard(const void* begin, size_t bytes) {}
};

struct Model {
  ModelConfig config;
  kernels::Matrix tok_embeddings;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  kernels::Matrix final_norm;      // [1, dim] f32
  kernels::Matrix lm_head;         // [vocab, dim]; same data as tok_embeddings when tied
  std::string source;              // the path it was loaded from
  std::vector<std::unique_ptr<Storage>> storage;  // keeps the views above alive
};

}  // namespace recall::model
