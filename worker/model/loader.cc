#include "worker/model/loader.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace recall::model {

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& path, bool keep_fp8) {
  if (IsDirectory(path)) return LoadHuggingFace(path, keep_fp8);
  RECALL_RETURN_IF_ERROR(CheckRegularFile(path));
  // A file of a Hugging Face directory read as a llama2.c checkpoint gave "header field dim =
  // 538970747 is invalid": name the mistake instead.
  const std::filesystem::path p(path);
  const std::string name = p.filename().string();
  if (name == "config.json" || name == "model.safetensors.index.json" ||
      p.extension() == ".safetensors") {
    const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " is a file of a Hugging Face model directory, not a llama2.c "
                     "checkpoint: give the directory (",
                     dir, ") as the model"));
  }
  // Another format's file (GGUF, random bytes) failed on its "dim": said for what it is.
  constexpr const char* kFormats =
      "Recall reads llama2.c checkpoints and Hugging Face model directories (config.json and "
      "safetensors)";
  std::string magic(4, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    in.read(magic.data(), 4);
    magic.resize(static_cast<size_t>(in.gcount()));
  }
  if (magic == "GGUF") {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a GGUF file: ", kFormats));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = LoadLlama2c(path);
  if (!model.ok() && absl::StrContains(model.status().message(), ": header field dim = ")) {
    return absl::Status(
        model.status().code(),
        absl::StrCat(model.status().message(), " (is it a llama2.c checkpoint? ", kFormats, ")"));
  }
  return model;
}

}  // namespace recall::model
