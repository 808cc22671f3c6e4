// The small random-weight model config the engine tests share: 4 query heads of 16 over 2 KV
// heads (GQA), dim 64, tied embeddings. Tests set what they need beyond that.
#pragma once

#include "worker/model/model_config.h"

namespace recall::testing {

inline model::ModelConfig TinyModelConfig(int n_layers, int max_seq_len) {
  model::ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = n_layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.max_seq_len = max_seq_len;
  c.tied_embeddings = true;
  return c;
}

}  // namespace recall::testing
