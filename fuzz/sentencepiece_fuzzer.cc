// LoadSentencePieceTokenizer on tokenizer.model files (libsentencepiece parses them; our
// wrapper must survive whatever it accepts); a tokenizer that loads is exercised.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "worker/tokenizer/tokenizer.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::ScratchDir() + "/tokenizer.model";
  fuzz::WriteFile(path, data, size);
  absl::StatusOr<std::unique_ptr<model::Tokenizer>> tok = model::LoadSentencePieceTokenizer(path);
  if (tok.ok()) fuzz::ExerciseTokenizer(**tok);
  return 0;
}
