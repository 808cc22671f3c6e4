// The "added_tokens" of a Hugging Face tokenizer.json and the splitting of text around them.
//
// As in the reference library, matches are leftmost-longest over the literal contents;
// lstrip/rstrip widen a match over the whitespace beside it, single_word drops a match that
// touches a word character. When special tokens are not parsed, a special match is still
// found but left in the text (so it can shadow an overlapping non-special token, as there).
// Thread safety: Split is const and safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/tokenizer_hf_regex.h"

namespace recall::model::hf {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  struct Piece {
    std::string_view text;
    int32_t id;  // -1: plain text for the pre-tokenizer
  };

  static absl::StatusOr<AddedTokenMatcher> Create(std::vector<AddedToken> tokens);

  // Appends the pieces of `text` to `out`, plain text and tokens in order.
  void Split(std::string_view text, bool parse_special, std::vector<Piece>* out) const;

  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;
    int token = -1;  // index into tokens_ of the token ending here
  };
  // The longest token starting at text[pos], -1 if none.
  int LongestAt(std::string_view text, size_t pos) const;
  // Whether the character at text[pos] is a word character (\w).
  bool IsWordChar(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::shared_ptr<const Regex> word_char_;
};

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsUnicodeWhitespace(int32_t code_point);

}  // namespace recall::model::hf
