// LoadHuggingFace on a directory whose model.safetensors.index.json is the input, beside a
// fixed config.json and two shards (hf_fixture.h).
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_util.h"
#include "fuzz/hf_fixture.h"
#include "worker/model/loader.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = fuzz::ScratchDir() + "/hf_index";
    std::filesystem::create_directories(d);
    fuzz::WriteHfFixture(d, /*sharded=*/true);
    return d;
  }();
  fuzz::WriteFile(dir + "/model.safetensors.index.json", data, size);
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::LoadHuggingFace(dir);
  if (m.ok()) fuzz::CheckModel(**m);
  return 0;
}
