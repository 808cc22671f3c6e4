#include "common/json_limits.h"

#include "absl/strings/str_cat.h"

namespace recall::json_limits {

absl::Status CheckJsonFile(std::string_view text) {
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("a NUL byte at byte ", nul, ": not JSON"));
  }
  return CheckJsonDepth(text);
}

absl::Status CheckJsonDepth(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(
            absl::StrCat("JSON nests deeper than ", max_depth, " levels at byte ", i));
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::json_limits
