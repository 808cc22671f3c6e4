// The end-of-sequence ids a Hugging Face model directory names: "eos_token_id" (one id or a
// list of ids) in generation_config.json, else in config.json. Shared by the tokenizers read
// from such a directory (tokenizer.json and tokenizer.model: Tokenizer::end_ids) and by the
// config.json reader (worker/model/hf_config.cc), so both files are held to one rule.
// Depends on common/ and nlohmann only (the model loaders' ASan test compiles it in).
// Thread safety: pure functions (ReadModelEosIds reads files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace recall::model::hf {

// The ids of `value`, the "eos_token_id" of the JSON file `path`: an integer in
// [0, vocab_size) or a list of them (null and [] give none). Otherwise InvalidArgument
// naming the file and the field: `PATH: field "eos_token_id[1]" = 5000 is not a token id
// (vocab_size 2048)`.
absl::StatusOr<std::vector<int32_t>> EosTokenIds(const std::string& path,
                                                 const nlohmann::json& value, int vocab_size);

// The eos_token_id ids of `dir`'s generation_config.json when it has the field, else those
// of its config.json; empty when neither names any. generation_config.json (read only here)
// is checked whole: InvalidArgument naming it for invalid JSON, a value that is not an
// object, or an eos_token_id that is not a token id below vocab_size or names none (null,
// []); a file without eos_token_id is fine. config.json's eos_token_id is held to the same
// rule (-1 there means none, as for the model loader); the rest of config.json is the model
// loader's to check (a config.json that is not JSON is passed over here).
absl::StatusOr<std::vector<int32_t>> ReadModelEosIds(const std::string& dir, int vocab_size);

}  // namespace recall::model::hf
