#include "worker/tokenizer/tokenizer_hf_added.h"

#include "common/status.h"
#include "common/utf8.h"

namespace recall::model::hf {
namespace {

bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The start of the character that ends just before `end`.
size_t PrevCharStart(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && IsContinuation(text[start])) --start;
  return start;
}

int32_t CodePointAt(std::string_view text, size_t pos) { return utf8::DecodeCodePoint(text, &pos); }

}  // namespace

bool IsUnicodeWhitespace(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

absl::StatusOr<AddedTokenMatcher> AddedTokenMatcher::Create(std::vector<AddedToken> tokens) {
  AddedTokenMatcher m;
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Regex> word, Regex::Compile("\\w", false));
  m.word_char_ = std::move(word);
  m.nodes_.emplace_back();
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t].content.empty()) continue;
    int node = 0;
    for (unsigned char c : tokens[t].content) {
      int child = -1;
      for (const auto& [byte, index] : m.nodes_[node].children) {
        if (byte == c) child = index;
      }
      if (child < 0) {
        child = static_cast<int>(m.nodes_.size());
        m.nodes_[node].children.emplace_back(c, child);
        m.nodes_.emplace_back();
      }
      node = child;
    }
    if (m.nodes_[node].token < 0) m.nodes_[node].token = static_cast<int>(t);
  }
  m.tokens_ = std::move(tokens);
  return m;
}

bool AddedTokenMatcher::IsWordChar(std::string_view text, size_t pos) const {
  size_t end = pos;
  utf8::DecodeCodePoint(text, &end);
  return word_char_->FullMatch(text.substr(pos, end - pos));
}

int AddedTokenMatcher::LongestAt(std::string_view text, size_t pos) const {
  int node = 0;
  int best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int child = -1;
    for (const auto& [byte, index] : nodes_[node].children) {
      if (byte == c) {
        child = index;
        break;
      }
    }
    if (child < 0) break;
    node = child;
    if (nodes_[node].token >= 0) best = nodes_[node].token;
  }
  return best;
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              std::vector<Piece>* out) const {
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    const int t = tokens_.empty() ? -1 : LongestAt(text, pos);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[t];
    size_t start = pos;
    size_t stop = pos + token.content.size();
    pos = stop;  // matches never overlap, accepted or not
    if (start < start_offset) continue;
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      const bool word_before = start > 0 && IsWordChar(text, PrevCharStart(text, start));
      const bool word_after = stop < text.size() && IsWordChar(text, stop);
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      while (start > start_offset) {
        const size_t prev = PrevCharStart(text, start);
        if (!IsUnicodeWhitespace(CodePointAt(text, prev))) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!IsUnicodeWhitespace(utf8::DecodeCodePoint(text, &next))) break;
        stop = next;
      }
      pos = stop;
    }
    if (start > start_offset) out->push_back({text.substr(start_offset, start - start_offset), -1});
    out->push_back({text.substr(start, stop - start), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({text.substr(start_offset), -1});
}

}  // namespace recall::model::hf
