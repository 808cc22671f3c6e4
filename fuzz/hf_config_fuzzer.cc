// LoadHuggingFace on a directory whose config.json is the input, beside a fixed tiny
// model.safetensors (hf_fixture.h): ReadHfConfig, then every tensor checked against it.
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_util.h"
#include "fuzz/hf_fixture.h"
#include "worker/model/loader.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = fuzz::ScratchDir() + "/hf_config";
    std::filesystem::create_directories(d);
    fuzz::WriteHfFixture(d, /*sharded=*/false);
    return d;
  }();
  fuzz::WriteFile(dir + "/config.json", data, size);
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::LoadHuggingFace(dir);
  if (m.ok()) fuzz::CheckModel(**m);
  return 0;
}
