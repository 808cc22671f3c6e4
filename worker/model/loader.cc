#include "worker/model/loader.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace recall::model {

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, bool keep_fp8) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
  }
  if (std::filesystem::is_directory(st)) return LoadHuggingFace(path, keep_fp8);
  return LoadLlama2c(path);
}

}  // namespace recall::model
