#include "client/cli/load_model.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/loader.h"

namespace recall::cli {

absl::StatusOr<Loaded> LoadAll(const Args& args) {
  Loaded out;
  const std::string model_path = args.GetString("model");
  RECALL_ASSIGN_OR_RETURN(out.model, model::LoadModel(model_path));
  std::string tok_path = args.GetString("tokenizer");
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

}  // namespace recall::cli
