#include "worker/model/load.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/system_memory.h"
#include "worker/model/loader.h"
#include "worker/model/quantize.h"
#include "worker/model/random_model.h"
#include "worker/model/tokenizer_fit.h"

namespace recall::model {
namespace {

std::string GiB(int64_t bytes) {
  return absl::StrCat(absl::SixDigits(static_cast<double>(bytes) / (1 << 30)), " GiB");
}

}  // namespace

absl::StatusOr<Loaded> LoadAll(const LoadOptions& options) {
  Loaded out;
  const std::string& model_path = options.model;
  if (model_path.empty()) return flags::FieldError("model", "required");
  if (options.random_weights) {
    const std::string config_path =
        IsDirectory(model_path) ? model_path + "/config.json" : model_path;
    RECALL_ASSIGN_OR_RETURN(const ModelConfig config, ReadHfConfig(config_path));
    const std::string& dtype = options.random_dtype;
    kernels::DType dt = kernels::DType::kBF16;
    if (dtype == "f32") {
      dt = kernels::DType::kF32;
    } else if (dtype == "f16") {
      dt = kernels::DType::kF16;
    } else if (dtype != "bf16") {
      return flags::FieldError("random_dtype",
                               absl::StrCat("\"", dtype, "\" is not one of f32, bf16, f16"));
    }
    // Filling more than the machine holds would swap it to a halt, or end in the OOM killer.
    const int64_t need = RandomModelBytes(config, dt);
    const int64_t available = AvailableMemoryBytes();
    if (available > 0 && need > available) {
      return flags::FieldError(
          "random_weights",
          absl::StrCat("the weights of ", config_path, " in ", dtype, " need ", GiB(need),
                       ", more than the ", GiB(available), " of memory available"),
          absl::StatusCode::kResourceExhausted);
    }
    absl::StatusOr<std::unique_ptr<Model>> random = MakeRandomModel(config, dt, /*seed=*/1);
    if (!random.ok()) {
      return flags::FieldError("random_weights", random.status().message(), random.status().code());
    }
    out.model = *std::move(random);
  } else {
    RECALL_ASSIGN_OR_RETURN(out.model, model::LoadModel(model_path, options.weight_dtype == "fp8"));
  }
  if (options.weight_dtype == "int8") {
    RECALL_RETURN_IF_ERROR(QuantizeWeightsInt8(*out.model));
  } else if (options.weight_dtype == "fp8") {
    // An FP8 checkpoint's weights were kept as stored; any other model is quantized.
    if (out.model->config.weight_dtype != kernels::DType::kF8E4M3) {
      RECALL_RETURN_IF_ERROR(QuantizeWeightsFp8(*out.model));
    }
  } else if (options.weight_dtype != "auto") {
    return flags::FieldError("weight_dtype", absl::StrCat("\"", options.weight_dtype,
                                                          "\" is not one of auto, int8, fp8"));
  }
  std::string tok_path = options.tokenizer;
  if (tok_path.empty() && options.random_weights) {
    tok_path = IsDirectory(model_path) ? model_path
                                       : std::filesystem::path(model_path).parent_path().string();
  }
  if (tok_path.empty()) {
    if (!IsDirectory(model_path)) {
      return flags::FieldError("tokenizer", absl::StrCat("required for the llama2.c checkpoint ",
                                                         model_path, " (e.g. its tokenizer.bin)"));
    }
    tok_path = model_path;
  }
  RECALL_ASSIGN_OR_RETURN(out.tokenizer,
                          model::LoadTokenizer(tok_path, out.model->config.vocab_size));
  out.hf_tokenizer = IsDirectory(tok_path)
                         ? CheckRegularFile(tok_path + "/tokenizer.json").ok()
                         : tok_path.size() >= 5 && tok_path.substr(tok_path.size() - 5) == ".json";
  if (absl::Status fit = CheckTokenizerFitsModel(out.model->config, *out.tokenizer, tok_path);
      !fit.ok()) {
    return flags::FieldError("tokenizer", fit.message());
  }
  return out;
}

}  // namespace recall::model
