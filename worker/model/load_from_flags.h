// Loading a model and its tokenizer from the --model / --tokenizer flags (shared by the
// `recall` subcommands that run a model in-process and by recall-worker).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/args.h"
#include "worker/model/model.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {

struct Loaded {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
  bool hf_tokenizer = false;
};

// --model PATH (llama2.c file or Hugging Face dir) and --tokenizer PATH (required for a
// llama2.c file). With --random-weights, --model is a Hugging Face config.json (or a folder
// holding one) and the weights are random, in --dtype (f32, bf16 or f16; default bf16): for
// speed benchmarks of real shapes. InvalidArgument naming the flag; loader errors name the
// file.
absl::StatusOr<Loaded> LoadAll(const Args& args);

}  // namespace recall::model
