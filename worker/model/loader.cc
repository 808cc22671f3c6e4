#include "worker/model/loader.h"

#include "common/files.h"
#include "common/status.h"

namespace recall::model {

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, bool keep_fp8) {
  if (IsDirectory(path)) return LoadHuggingFace(path, keep_fp8);
  RECALL_RETURN_IF_ERROR(CheckRegularFile(path));
  return LoadLlama2c(path);
}

}  // namespace recall::model
