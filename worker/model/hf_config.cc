// ReadHfConfig: a Hugging Face config.json to a ModelConfig (Llama, Mistral, Qwen2, Qwen3).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/json_limits.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/model/random_model.h"
#include "worker/tokenizer/tokenizer_eos_ids.h"

namespace recall::model {
namespace {

using nlohmann::json;

struct ArchEntry {
  const char* architecture;  // config "architectures"[0]
  const char* model_type;    // config "model_type"
  Arch arch;
  int default_max_positions;  // transformers' default for max_position_embeddings
};

constexpr ArchEntry kArchs[] = {
    {"LlamaForCausalLM", "llama", Arch::kLlama, 2048},
    {"MistralForCausalLM", "mistral", Arch::kMistral, 32768},
    {"Qwen2ForCausalLM", "qwen2", Arch::kQwen2, 32768},
    {"Qwen3ForCausalLM", "qwen3", Arch::kQwen3, 32768},
};
constexpr char kSupported[] =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

absl::Status FieldError(const std::string& path, const std::string& field,
                        const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", field, "\" ", problem));
}

bool Present(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

// An integer field in int range; `fallback` when absent (or null) unless `required`.
absl::StatusOr<int> GetInt(const std::string& path, const json& j, const char* key, bool required,
                           int fallback) {
  if (!Present(j, key)) {
    if (required) return FieldError(path, key, "is missing");
    return fallback;
  }
  const json& v = j.at(key);
  if (!v.is_number_integer()) return FieldError(path, key, "must be an integer, got " + v.dump());
  const int64_t x = v.is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX))
                        : v.get<int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
    return FieldError(path, key, absl::StrCat("= ", x, " does not fit in an int"));
  }
  return static_cast<int>(x);
}

absl::StatusOr<float> GetFloat(const std::string& path, const json& j, const char* key,
                               float fallback) {
  if (!Present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number()) return FieldError(path, key, "must be a number, got " + v.dump());
  return static_cast<float>(v.get<double>());
}

absl::StatusOr<bool> GetBool(const std::string& path, const json& j, const char* key,
                             bool fallback) {
  if (!Present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_boolean()) return FieldError(path, key, "must be true or false, got " + v.dump());
  return v.get<bool>();
}

// bos/eos ids: an integer, a list of integers (the first is taken), or null (-1: none).
absl::StatusOr<int> GetTokenId(const std::string& path, const json& j, const char* key,
                               int fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return -1;
  if (it->is_array()) {
    if (it->empty()) return -1;
    json first = {{key, (*it)[0]}};
    return GetInt(path, first, key, /*required=*/true, fallback);
  }
  return GetInt(path, j, key, /*required=*/true, fallback);
}

absl::StatusOr<const ArchEntry*> FindArch(const std::string& path, const json& j) {
  std::string name;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty()) {
    if (!(*it)[0].is_string()) return FieldError(path, "architectures", "must list strings");
    name = (*it)[0].get<std::string>();
    for (const ArchEntry& a : kArchs) {
      if (name == a.architecture) return &a;
    }
  } else if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string()) {
    name = mt->get<std::string>();
    for (const ArchEntry& a : kArchs) {
      if (name == a.model_type) return &a;
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": neither \"architectures\" nor \"model_type\" is set (supported: ", kSupported,
        ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported architecture \"", name,
                                                 "\" (supported: ", kSupported, ")"));
}

// quantization_config: absent, or an FP8 checkpoint (quant_method "fp8", E4M3 weights,
// optional weight_block_size [rows, cols]); every other method is refused by name.
absl::Status ParseQuantization(const std::string& path, const json& j, ModelConfig& c) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const std::string field = "quantization_config";
  if (!it->is_object()) return FieldError(path, field, "must be an object, got " + it->dump());
  auto method = it->find("quant_method");
  if (method == it->end() || !method->is_string()) {
    return FieldError(path, field + ".quant_method", "is missing (supported: fp8)");
  }
  if (*method != "fp8") {
    return FieldError(path, field + ".quant_method",
                      "= " + method->dump() + " is not supported (supported: fp8)");
  }
  if (auto fmt = it->find("fmt"); fmt != it->end() && *fmt != "e4m3") {
    return FieldError(path, field + ".fmt", "= " + fmt->dump() + " is not supported (only e4m3)");
  }
  c.fp8 = true;
  auto block = it->find("weight_block_size");
  if (block == it->end() || block->is_null()) return absl::OkStatus();
  if (!block->is_array() || block->size() != 2) {
    return FieldError(path, field + ".weight_block_size",
                      "must be [rows, cols], got " + block->dump());
  }
  for (int i = 0; i < 2; ++i) {
    const json& v = (*block)[i];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 20)) {
      return FieldError(path, field + ".weight_block_size",
                        "entries must be integers in [1, 1048576], got " + block->dump());
    }
    c.fp8_block[i] = v.get<int>();
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseConfig(const std::string& path, const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError(path + ": not a JSON object");
  RECALL_ASSIGN_OR_RETURN(const ArchEntry* arch, FindArch(path, j));
  ModelConfig c;
  c.arch = arch->arch;
  RECALL_ASSIGN_OR_RETURN(c.dim, GetInt(path, j, "hidden_size", true, 0));
  RECALL_ASSIGN_OR_RETURN(c.hidden_dim, GetInt(path, j, "intermediate_size", true, 0));
  RECALL_ASSIGN_OR_RETURN(c.n_layers, GetInt(path, j, "num_hidden_layers", true, 0));
  RECALL_ASSIGN_OR_RETURN(c.n_heads, GetInt(path, j, "num_attention_heads", true, 0));
  RECALL_ASSIGN_OR_RETURN(c.n_kv_heads, GetInt(path, j, "num_key_value_heads", false, c.n_heads));
  if (c.n_heads <= 0) return FieldError(path, "num_attention_heads", "must be positive");
  RECALL_ASSIGN_OR_RETURN(c.head_dim, GetInt(path, j, "head_dim", false, c.dim / c.n_heads));
  if (!Present(j, "head_dim") && c.dim % c.n_heads != 0) {
    return FieldError(path, "num_attention_heads",
                      absl::StrCat("= ", c.n_heads, " does not divide hidden_size = ", c.dim,
                                   " (and no head_dim is given)"));
  }
  RECALL_ASSIGN_OR_RETURN(c.vocab_size, GetInt(path, j, "vocab_size", true, 0));
  RECALL_ASSIGN_OR_RETURN(c.max_seq_len, GetInt(path, j, "max_position_embeddings", false,
                                                arch->default_max_positions));
  RECALL_ASSIGN_OR_RETURN(c.rope_theta, GetFloat(path, j, "rope_theta", 10000.0f));
  RECALL_ASSIGN_OR_RETURN(c.norm_eps, GetFloat(path, j, "rms_norm_eps", 1e-6f));
  RECALL_ASSIGN_OR_RETURN(c.tied_embeddings, GetBool(path, j, "tie_word_embeddings", false));
  c.tie_given = Present(j, "tie_word_embeddings");
  RECALL_ASSIGN_OR_RETURN(c.bos_token_id, GetTokenId(path, j, "bos_token_id", 1));
  RECALL_ASSIGN_OR_RETURN(c.eos_token_id, GetTokenId(path, j, "eos_token_id", 2));
  c.rope_style = kernels::RopeStyle::kHalfSplit;
  c.qkv_bias = c.arch == Arch::kQwen2;
  c.qk_norm = c.arch == Arch::kQwen3;

  // Features the runtime does not implement: refuse rather than compute something else.
  RECALL_ASSIGN_OR_RETURN(bool attention_bias, GetBool(path, j, "attention_bias", false));
  if (attention_bias && c.arch != Arch::kQwen2) {
    return FieldError(path, "attention_bias", "= true is not supported (no o_proj bias)");
  }
  RECALL_ASSIGN_OR_RETURN(bool mlp_bias, GetBool(path, j, "mlp_bias", false));
  if (mlp_bias) return FieldError(path, "mlp_bias", "= true is not supported");
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    const bool plain =
        it->is_object() && it->value("rope_type", it->value("type", "")) == "default";
    if (!plain) return FieldError(path, "rope_scaling", "= " + it->dump() + " is not supported");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null() && *it != "silu") {
    return FieldError(path, "hidden_act", "= " + it->dump() + " is not supported (only silu)");
  }
  // Sliding-window attention (Mistral; Qwen with use_sliding_window): within the window it is
  // full attention, so the context is held to the window and every step is exact. (It was
  // ignored: past the window the model attended to more than it was trained to.)
  RECALL_ASSIGN_OR_RETURN(const bool use_window, GetBool(path, j, "use_sliding_window", false));
  if (Present(j, "sliding_window") && (c.arch == Arch::kMistral || use_window)) {
    RECALL_ASSIGN_OR_RETURN(const int window, GetInt(path, j, "sliding_window", true, 0));
    if (window <= 0) return FieldError(path, "sliding_window", "must be positive");
    c.max_seq_len = std::min(c.max_seq_len, window);
  }
  // Every EOS id of a list is a token (each ends a reply: Tokenizer::end_ids).
  // The rule generation_config.json's eos_token_id is held to as well (tokenizer_eos_ids.h).
  if (auto it = j.find("eos_token_id"); it != j.end() && it->is_array()) {
    RECALL_RETURN_IF_ERROR(hf::EosTokenIds(path, *it, c.vocab_size).status());
  }
  RECALL_RETURN_IF_ERROR(ParseQuantization(path, j, c));
  RECALL_RETURN_IF_ERROR(Annotate(c.Validate(), path));
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& config_json_path) {
  RECALL_RETURN_IF_ERROR(CheckRegularFile(config_json_path));
  RECALL_ASSIGN_OR_RETURN(const std::string text,
                          ReadSmallFile("", config_json_path, size_t{16} << 20));  // a few KB
  if (absl::Status s = json_limits::CheckJsonFile(text); !s.ok()) {
    return Annotate(s, config_json_path);
  }
  try {
    const json j = json::parse(text);
    RECALL_ASSIGN_OR_RETURN(ModelConfig c, ParseConfig(config_json_path, j));
    // generation_config.json beside it is the model's too: held to its rule whether or not
    // the tokenizer read is beside it (one elsewhere left it unread, a bad one unsaid).
    const std::string dir = std::filesystem::path(config_json_path).parent_path().string();
    RECALL_RETURN_IF_ERROR(hf::ReadModelEosIds(dir.empty() ? "." : dir, c.vocab_size).status());
    return c;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_json_path, ": invalid JSON: ", e.what()));
  }
}

}  // namespace recall::model
