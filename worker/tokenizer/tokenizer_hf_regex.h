// A compiled PCRE2 regular expression in UTF + UCP mode (so \p{L}, \s, \w are Unicode
// aware), used by the Hugging Face pre-tokenizers. Subjects may hold ill-formed UTF-8:
// such bytes never match (PCRE2_MATCH_INVALID_UTF) and end up between matches.
// Thread safety: FindAll/Matches are const and safe to call concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace recall::model::hf {

class Regex {
 public:
  // Compiles `pattern`; with `literal` the pattern is matched as plain text.
  // InvalidArgument (with PCRE2's message and offset) when the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of the non-overlapping, non-empty matches of `text`,
  // left to right.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

  // True when the pattern matches all of `text`.
  bool FullMatch(std::string_view text) const;

 private:
  explicit Regex(pcre2_real_code_8* code) : code_(code) {}
  pcre2_real_code_8* code_;
};

// Rewrites \s (outside and inside character classes) and \S (outside classes) as the
// Unicode White_Space set, which is what Oniguruma, the reference library's regex engine,
// matches; PCRE2 10.42's \s also takes U+180E. Other escapes are kept verbatim (\S inside
// a class too).
std::string OnigurumaCompatiblePattern(std::string_view pattern);

}  // namespace recall::model::hf
