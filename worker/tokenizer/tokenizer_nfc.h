// Unicode Normalization Form C, for tokenizer.json files whose normalizer is "NFC"
// (Qwen2 and others). Tables in tokenizer_nfc_tables.h (generated from Unicode data);
// Hangul is algorithmic. Ill-formed UTF-8 bytes are kept as they are and block composition.
// Thread safety: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace recall::model {

std::string ToNfc(std::string_view text);

}  // namespace recall::model
