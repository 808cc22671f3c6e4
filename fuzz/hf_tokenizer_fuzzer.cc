// LoadHfTokenizer on tokenizer.json files; a tokenizer that loads is exercised.
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_util.h"
#include "worker/tokenizer/tokenizer.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const std::string dir = fuzz::ScratchDir() + "/hf_tokenizer";
    std::filesystem::create_directories(dir);
    return dir + "/tokenizer.json";
  }();
  fuzz::WriteFile(path, data, size);
  absl::StatusOr<std::unique_ptr<model::Tokenizer>> tok = model::LoadHfTokenizer(path);
  if (tok.ok()) fuzz::ExerciseTokenizer(**tok);
  return 0;
}
