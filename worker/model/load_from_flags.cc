#include "worker/model/load_from_flags.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/loader.h"
#include "worker/model/random_model.h"

namespace recall::model {

absl::StatusOr<Loaded> LoadAll(const Args& args) {
  Loaded out;
  const std::string model_path = args.GetString("model");
  if (model_path.empty()) return absl::InvalidArgumentError("--model: required");
  if (args.Has("random-weights")) {
    const std::string config_path = std::filesystem::is_directory(model_path)
                                        ? model_path + "/config.json"
                                        : model_path;
    RECALL_ASSIGN_OR_RETURN(const ModelConfig config, ReadHfConfig(config_path));
    const std::string dtype = args.GetString("dtype", "bf16");
    kernels::DType dt = kernels::DType::kBF16;
    if (dtype == "f32") {
      dt = kernels::DType::kF32;
    } else if (dtype == "f16") {
      dt = kernels::DType::kF16;
    } else if (dtype != "bf16") {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype: '", dtype, "' is not one of f32, bf16, f16"));
    }
    RECALL_ASSIGN_OR_RETURN(out.model, MakeRandomModel(config, dt, /*seed=*/1));
  } else {
    RECALL_ASSIGN_OR_RETURN(out.model, model::LoadModel(model_path));
  }
  std::string tok_path = args.GetString("tokenizer");
  if (tok_path.empty() && args.Has("random-weights")) {
    tok_path = std::filesystem::is_directory(model_path)
                   ? model_path
                   : std::filesystem::path(model_path).parent_path().string();
  }
  if (tok_path.empty()) {
    if (!std::filesystem::is_directory(model_path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer: required for the llama2.c checkpoint ", model_path,
          " (e.g. its tokenizer.bin)"));
    }
    tok_path = model_path;
  }
  RECALL_ASSIGN_OR_RETURN(out.tokenizer,
                          model::LoadTokenizer(tok_path, out.model->config.vocab_size));
  out.hf_tokenizer = std::filesystem::is_directory(tok_path)
                         ? std::filesystem::exists(tok_path + "/tokenizer.json")
                         : tok_path.size() >= 5 && tok_path.substr(tok_path.size() - 5) == ".json";
  if (out.tokenizer->vocab_size() > out.model->config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer: its vocabulary (", out.tokenizer->vocab_size(),
        " tokens) is larger than the model's (", out.model->config.vocab_size, ")"));
  }
  return out;
}

}  // namespace recall::model
