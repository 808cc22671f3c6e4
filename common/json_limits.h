// Limits applied to untrusted JSON text (model configs, safetensors headers, tokenizer.json)
// before it is parsed. nlohmann::json parses iteratively, but copying, comparing and dumping
// a value recurse once per nesting level, so a file of a million '[' would overflow the
// stack long after parsing succeeded; CheckJsonDepth refuses such text up front.
// Thread safety: pure functions.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace recall::json_limits {

// Real model files nest at most ~8 levels; this leaves room for any of them.
inline constexpr int kMaxDepth = 64;

// InvalidArgument ("JSON nests deeper than N levels at byte K") when arrays/objects in
// `text` nest more than `max_depth` levels. Brackets inside strings are skipped; the text is
// not otherwise validated (the parser does that).
absl::Status CheckJsonDepth(std::string_view text, int max_depth = kMaxDepth);

// CheckJsonDepth of a JSON file's whole text, which also refuses a NUL byte ("a NUL byte at
// byte K: not JSON"): the parser takes one as the end of its input, so a file's JSON followed
// by anything at all was taken. (A safetensors header may be padded; it is checked alone.)
absl::Status CheckJsonFile(std::string_view text);

}  // namespace recall::json_limits
