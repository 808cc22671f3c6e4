// Helpers shared by the tokenizer implementations (not part of the public interface).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::model::internal {

// The whole file at `path`: NotFound naming the path when it does not exist,
// FailedPrecondition when it is a directory, Unavailable when it cannot be read.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);

// One piece of text cut around literal special-token markers: either plain text
// (special_index < 0) or the marker literals[special_index].
struct TextSegment {
  std::string_view text;
  int special_index = -1;
};

// Splits `text` around every occurrence of the `literals` (leftmost, then longest, wins).
std::vector<TextSegment> SplitOnLiterals(std::string_view text,
                                         const std::vector<std::string>& literals);

}  // namespace recall::model::internal
