// The model shapes the speed benchmarks run with random weights: real models' configs,
// written out so that no config file is needed.
#pragma once

#include <string>

#include "worker/model/model.h"

namespace recall::bench {

// smollm2-135m, qwen2.5-0.5b, llama-3.2-1b or llama-3-8b (max_seq_len 16384); dim 0 for
// another name.
inline model::ModelConfig NamedShape(const std::string& name) {
  model::ModelConfig c;
  c.max_seq_len = 16384;
  c.rope_style = kernels::RopeStyle::kHalfSplit;
  if (name == "smollm2-135m") {
    c.dim = 576, c.hidden_dim = 1536, c.n_layers = 30, c.n_heads = 9, c.n_kv_heads = 3;
    c.head_dim = 64, c.vocab_size = 49152, c.rope_theta = 100000, c.tied_embeddings = true;
  } else if (name == "qwen2.5-0.5b") {
    c.dim = 896, c.hidden_dim = 4864, c.n_layers = 24, c.n_heads = 14, c.n_kv_heads = 2;
    c.head_dim = 64, c.vocab_size = 151936, c.rope_theta = 1e6, c.tied_embeddings = true;
    c.qkv_bias = true, c.norm_eps = 1e-6f;
  } else if (name == "llama-3.2-1b") {
    c.dim = 2048, c.hidden_dim = 8192, c.n_layers = 16, c.n_heads = 32, c.n_kv_heads = 8;
    c.head_dim = 64, c.vocab_size = 128256, c.rope_theta = 500000, c.tied_embeddings = true;
  } else if (name == "llama-3-8b") {
    c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8;
    c.head_dim = 128, c.vocab_size = 128256, c.rope_theta = 500000;
  } else {
    c.dim = 0;
  }
  return c;
}

}  // namespace recall::bench
