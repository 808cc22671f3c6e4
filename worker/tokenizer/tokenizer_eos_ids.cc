#include "worker/tokenizer/tokenizer_eos_ids.h"

#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/json_limits.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace recall::model::hf {
namespace {

using nlohmann::json;

constexpr char kField[] = "eos_token_id";

absl::Status NotATokenId(const std::string& path, const std::string& field, const json& v,
                         int vocab_size) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", field, "\" = ", v.dump(),
                                                 " is not a token id (vocab_size ", vocab_size,
                                                 ")"));
}

bool IsTokenId(const json& v, int vocab_size) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() < static_cast<uint64_t>(vocab_size);
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size;
}

// The file's JSON object; nullopt when it is missing. Strict: a file that cannot be read or
// is not a JSON object is an error naming it; otherwise nullopt too.
absl::StatusOr<std::optional<json>> ReadObject(const std::string& path, bool strict) {
  if (!Exists(path)) return std::nullopt;
  absl::StatusOr<std::string> text = ReadSmallFile("", path, size_t{16} << 20);  // a few KB
  if (!text.ok()) {
    if (!strict) return std::nullopt;
    return text.status();
  }
  if (absl::Status s = json_limits::CheckJsonFile(*text); !s.ok()) {
    if (!strict) return std::nullopt;
    return Annotate(s, path);
  }
  json j;
  try {
    j = json::parse(*text);
  } catch (const json::exception& e) {
    if (!strict) return std::nullopt;
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    if (!strict) return std::nullopt;
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return std::optional<json>(std::move(j));
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EosTokenIds(const std::string& path, const json& value,
                                                 int vocab_size) {
  std::vector<int32_t> ids;
  if (value.is_null()) return ids;
  if (!value.is_array()) {
    if (!IsTokenId(value, vocab_size)) return NotATokenId(path, kField, value, vocab_size);
    ids.push_back(value.get<int32_t>());
    return ids;
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const json& id = value[i];
    if (!IsTokenId(id, vocab_size)) {
      return NotATokenId(path, absl::StrCat(kField, "[", i, "]"), id, vocab_size);
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> ReadModelEosIds(const std::string& dir, int vocab_size) {
  const std::filesystem::path base(dir);
  const std::string generation = (base / "generation_config.json").string();
  RECALL_ASSIGN_OR_RETURN(const std::optional<json> gen, ReadObject(generation, /*strict=*/true));
  if (gen.has_value() && gen->contains(kField)) {
    const json& value = gen->at(kField);
    RECALL_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EosTokenIds(generation, value, vocab_size));
    if (ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(generation, ": field \"", kField, "\" = ", value.dump(),
                       " names no token (leave the field out to use config.json's)"));
    }
    return ids;
  }
  const std::string config = (base / "config.json").string();
  RECALL_ASSIGN_OR_RETURN(const std::optional<json> conf, ReadObject(config, /*strict=*/false));
  if (!conf.has_value() || !conf->contains(kField)) return std::vector<int32_t>{};
  const json& value = conf->at(kField);
  // config.json's -1 means none, as the model loader reads it (ModelConfig::Validate).
  if (value.is_number_integer() && value.get<int64_t>() == -1) return std::vector<int32_t>{};
  return EosTokenIds(config, value, vocab_size);
}

}  // namespace recall::model::hf
