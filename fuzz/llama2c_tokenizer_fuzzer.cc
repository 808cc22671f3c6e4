// LoadLlama2cTokenizer on tokenizer.bin files, reading every token (vocab_size 0) and
// exactly 512 (stories260K's vocab_size); a tokenizer that loads is exercised.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "worker/tokenizer/tokenizer.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::ScratchDir() + "/tokenizer.bin";
  fuzz::WriteFile(path, data, size);
  for (int vocab : {0, 512}) {
    absl::StatusOr<std::unique_ptr<model::Tokenizer>> tok =
        model::LoadLlama2cTokenizer(path, vocab);
    if (tok.ok()) fuzz::ExerciseTokenizer(**tok);
  }
  return 0;
}
