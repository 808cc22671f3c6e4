// LoadLlama2c on llama2.c checkpoints; when one loads, LoadAll on it and a llama2.c
// tokenizer of its vocab_size (the pair a worker's turn runs on, issue 27's crash).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "tests/worker/model/test_files.h"
#include "worker/model/load.h"
#include "worker/model/loader.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::ScratchDir() + "/model.bin";
  static const std::string tok_path = fuzz::ScratchDir() + "/tokenizer.bin";
  static int tok_vocab = -1;
  fuzz::WriteFile(path, data, size);
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::LoadLlama2c(path);
  if (!m.ok()) return 0;
  fuzz::CheckModel(**m);
  const int vocab = (*m)->config.vocab_size;
  if (vocab != tok_vocab) {  // the synthetic tokenizer has at most 312 tokens
    fuzz::WriteFile(tok_path, model::test::Llama2cTokenizerBytes(
                                  std::min(vocab, model::test::kLlama2cTokenizerMaxVocab)));
    tok_vocab = vocab;
  }
  model::LoadOptions options;
  options.model = path;
  options.tokenizer = tok_path;
  absl::StatusOr<model::Loaded> loaded = model::LoadAll(options);
  if (!loaded.ok()) return 0;
  fuzz::CheckModel(*loaded->model);
  fuzz::ExerciseTokenizer(*loaded->tokenizer);
  fuzz::Require(loaded->tokenizer->vocab_size() <= loaded->model->config.vocab_size,
                "LoadAll accepted a tokenizer larger than the model");
  return 0;
}
