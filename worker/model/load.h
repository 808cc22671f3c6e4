// Loading a model and its tokenizer together (the `recall` subcommands that run a model
// in-process and recall-worker).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/model.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {

struct Loaded {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
  bool hf_tokenizer = false;
};

struct LoadOptions {
  std::string model;      // a llama2.c file or a Hugging Face folder
  std::string tokenizer;  // required for a llama2.c file; default: the one in the folder
  // `model` is a Hugging Face config.json (or a folder holding one) and the weights are
  // random, in random_dtype (f32, bf16 or f16): for speed benchmarks of real shapes.
  bool random_weights = false;
  std::string random_dtype = "bf16";
  // How matrix weights are held: "auto" (as loaded; an FP8 checkpoint widened to bf16),
  // "int8" (quantized at load, worker/model/quantize.h) or "fp8" (an FP8 checkpoint's linear
  // weights kept as E4M3, worker/model/fp8.h, any other model's quantized to E4M3 at load,
  // quantize.h; runs on CUDA devices only).
  std::string weight_dtype = "auto";
};

// InvalidArgument naming the option field (flags::FieldError: model, tokenizer,
// random_dtype, weight_dtype); loader errors name the file. The tokenizer must fit the model
// (CheckTokenizerFitsModel), so a pair that loads can run a turn.
absl::StatusOr<Loaded> LoadAll(const LoadOptions& options);

}  // namespace recall::model
