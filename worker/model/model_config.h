// The shape and numerics of a decoder-only transformer, independent of its file format.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recall::model {

enum class Arch { kLlama, kMistral, kQwen2, kQwen3 };
const char* ArchName(Arch arch);

struct ModelConfig {
  Arch arch = Arch::kLlama;
  int dim = 0;          // hidden size
  int hidden_dim = 0;   // MLP intermediate size
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads (GQA when < n_heads)
  int head_dim = 0;     // usually dim / n_heads (Qwen3 may differ)
  int vocab_size = 0;
  int max_seq_len = 0;  // trained context length
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  kernels::RopeStyle rope_style = kernels::RopeStyle::kHalfSplit;
  bool tied_embeddings = false;  // lm_head shares the token embedding
  // Hugging Face: config.json gives tie_word_embeddings (false then needs an lm_head.weight;
  // without the key a checkpoint lacking one is tied).
  bool tie_given = false;
  bool qkv_bias = false;         // Qwen2
  bool qk_norm = false;          // Qwen3: RMSNorm over each q/k head before RoPE
  kernels::DType weight_dtype = kernels::DType::kF32;
  // An FP8 checkpoint (config.json quantization_config, quant_method "fp8"): linear weights
  // stored as F8_E4M3 with `weight_scale_inv` scales over blocks of fp8_block[0] rows x
  // fp8_block[1] columns ({0, 0}: one scale per tensor). The loader widens them to bf16, or
  // keeps them (weight_dtype is then kF8E4M3; worker/model/fp8.h).
  bool fp8 = false;
  int fp8_block[2] = {0, 0};
  int bos_token_id = 1;  // -1: none
  int eos_token_id = 2;  // -1: none

  // Checks that the numbers are positive, bounded (size arithmetic stays in int64) and
  // consistent (n_kv_heads divides n_heads, head_dim even, n_heads * head_dim bounded,
  // bos/eos ids inside the vocabulary); the message names the field and the limit.
  absl::Status Validate() const;

  // The layers' linear weights as served: "bf16", "int8", "int8 (from FP8)", ... (the
  // worker's start-up line and Info.weights).
  std::string WeightsName() const;
};

}  // namespace recall::model
