// UTF-8 helpers: validation (requests, tokenizers) and lossy decoding (TokenStreamDecoder).
//
// Well-formedness follows the Unicode standard (Table 3-7); ill-formed input is replaced by
// U+FFFD one "maximal subpart" at a time, which is what Rust's String::from_utf8_lossy (and
// so the Hugging Face tokenizers library) does.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace recall::utf8 {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

enum class SequenceKind {
  kValid,       // a whole well-formed character of `length` bytes
  kInvalid,     // an ill-formed maximal subpart of `length` (>= 1) bytes
  kIncomplete,  // the first `length` bytes of a character cut off by the end of input
};

struct Sequence {
  SequenceKind kind;
  size_t length;
};

// Classifies the bytes starting at text[pos]. REQUIRES: pos < text.size().
Sequence NextSequence(std::string_view text, size_t pos);

// `text` with every ill-formed subpart (an incomplete tail included) replaced by U+FFFD.
std::string ToValidLossy(std::string_view text);

// True when `text` is entirely well-formed UTF-8.
bool IsValid(std::string_view text);

// Appends the UTF-8 encoding of `code_point` to `out`.
void AppendCodePoint(char32_t code_point, std::string* out);

// Decodes the character at text[pos] (advancing pos), or returns -1 for an ill-formed byte
// (advancing pos by one).
int32_t DecodeCodePoint(std::string_view text, size_t* pos);

}  // namespace recall::utf8
