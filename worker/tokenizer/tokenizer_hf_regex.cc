#include "worker/tokenizer/tokenizer_hf_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recall::model::hf {
namespace {

// Frees match data at scope exit.
struct MatchData {
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(data); }
  pcre2_match_data* data;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  // PCRE2_LITERAL does not combine with PCRE2_UCP (which a literal does not need).
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex does not compile at offset ",
                                                   error_offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter still works
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(code_); }

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  MatchData md(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), offset, 0, md.data, nullptr);
    if (rc < 0) break;  // no match (or a matching error: the rest stays unmatched)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    if (ov[1] > ov[0]) {
      matches.emplace_back(ov[0], ov[1]);
      offset = ov[1];
    } else {  // an empty match: move on by one character
      offset = ov[0] + 1;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) {
        ++offset;
      }
    }
  }
  return matches;
}

bool Regex::FullMatch(std::string_view text) const {
  MatchData md(code_);
  const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, md.data, nullptr);
  return rc >= 0;
}

std::string OnigurumaCompatiblePattern(std::string_view pattern) {
  // The Unicode White_Space property, which Oniguruma's \s matches.
  constexpr char kWhiteSpace[] =
      "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
      "\\x{202F}\\x{205F}\\x{3000}";
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : absl::StrCat("[", kWhiteSpace, "]");
      } else if (e == 'S' && !in_class) {
        out += absl::StrCat("[^", kWhiteSpace, "]");
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace recall::model::hf
