// SafetensorsFile::Open on safetensors files; every tensor of a file that opens must lie
// inside the mapping with the size its dtype and shape imply.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_util.h"
#include "worker/model/half.h"
#include "worker/model/safetensors.h"

using namespace recall;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::ScratchDir() + "/model.safetensors";
  fuzz::WriteFile(path, data, size);
  absl::StatusOr<std::unique_ptr<model::SafetensorsFile>> file = model::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  const std::unique_ptr<model::Storage> storage = (*file)->ReleaseStorage();
  const char* base = static_cast<const char*>(storage->data());
  uint64_t covered = 0;
  for (const auto& [name, t] : (*file)->tensors()) {
    const char* begin = static_cast<const char*>(t.data);
    fuzz::Require(begin >= base + 8 && begin + t.bytes <= base + storage->size(),
                  absl::StrCat("tensor \"", name, "\" lies outside the file"));
    fuzz::Require(t.bytes == static_cast<uint64_t>(t.numel()) * kernels::DTypeSize(t.dtype),
                  absl::StrCat("tensor \"", name, "\" size disagrees with its shape"));
    if (t.numel() > 0) {
      model::LoadAsF32(t.data, t.dtype, 0);
      model::LoadAsF32(t.data, t.dtype, t.numel() - 1);
    }
    covered += t.bytes;
  }
  fuzz::Require(covered <= storage->size(), "tensors cover more bytes than the file holds");
  return 0;
}
