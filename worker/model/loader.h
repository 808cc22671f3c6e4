// Model loaders. Every failure is a Status whose message names the file and the problem
// (truncated, size mismatch, unknown architecture, ...); loaders never crash on bad files.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/model.h"

namespace recall::model {

// llama2.c checkpoint (run.c format): header of 7 int32 (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len; vocab_size < 0 means an untied classifier follows), then
// fp32 weights in llama2.c order. RoPE interleaved, theta 10000, eps 1e-5. InvalidArgument
// naming the header field for a value out of range; DataLoss when the file is not exactly
// the size the header implies (naming vocab_size when another value would fit).
absl::StatusOr<std::unique_ptr<Model>> LoadLlama2c(const std::string& path);

// Hugging Face directory: config.json plus model.safetensors, or sharded
// model-0000x-of-0000y.safetensors with model.safetensors.index.json. Llama, Mistral,
// Qwen2 and Qwen3 families; f32, f16, bf16 tensors, and FP8 checkpoints (fp8.h), whose
// linear weights are widened to bf16 or, with keep_fp8, kept as DType::kF8E4M3 (the
// embeddings and LM head are widened either way). RoPE half-split. InvalidArgument naming
// the tensor and why for one the model does not read (a layer past num_hidden_layers, a bias
// the architecture has none of; a tied model's lm_head.weight and rotary inv_freq buffers
// are accepted unread), and naming config.json's tie_word_embeddings when it is false and
// there is no lm_head.weight (without the key such a checkpoint is tied).
absl::StatusOr<std::unique_ptr<Model>> LoadHuggingFace(const std::string& dir,
                                                       bool keep_fp8 = false);

// A directory is loaded as Hugging Face, a file as llama2.c (InvalidArgument, saying to give
// the directory, for a file named config.json, model.safetensors.index.json or *.safetensors).
// keep_fp8: as LoadHuggingFace.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, bool keep_fp8 = false);

}  // namespace recall::model
