// The llama2.c tokenizer.bin format and the encode/decode of Karpathy's run.c.
//
// File: int32 max_token_length, then per token: float score, int32 length, `length` bytes
// (little-endian, as written by llama2.c's tokenizer.py). Ids 0, 1, 2 are <unk>, BOS, EOS.
//
// Encode is run.c's `encode`: a dummy-prefix " " token when the text is non-empty, one
// token per UTF-8 code point (byte-fallback ids byte+3 when the code point is not a piece;
// <unk> when byte+3 is past a vocabulary too small for it, where run.c reads out of bounds),
// then repeatedly merge the adjacent pair whose concatenation is the piece with the highest
// score (leftmost on ties). run.c rescans every pair after each merge; we keep the pairs in
// a priority queue ordered by (score, position), which picks the same pair at every step in
// O(n log n). As in C, the text ends at its first NUL byte.
// Extension: with parse_special, literal "<s>" and "</s>" become BOS and EOS and the text
// between them is encoded segment by segment (as Meta's Llama 2 chat code encodes turns).
//
// Decode is run.c's `decode` + `safe_printf`: after BOS a leading space is dropped, "<0xHH>"
// pieces are that raw byte, and a one-byte piece that is neither printable ASCII nor
// whitespace prints nothing.
#include <cstdint>
#include <cstring>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_internal.h"

namespace recall::model {
namespace {

constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

bool IsPrintOrSpace(unsigned char c) {
  return (c >= 0x20 && c < 0x7F) || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores)
      : pieces_(std::move(pieces)), scores_(std::move(scores)) {
    for (int32_t id = 0; id < static_cast<int32_t>(pieces_.size()); ++id) {
      piece_to_id_.emplace(pieces_[id], id);  // the first of duplicate pieces wins
    }
    if (auto it = piece_to_id_.find(std::string_view(" ")); it != piece_to_id_.end()) {
      dummy_prefix_id_ = it->second;
    }
  }

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special) const override {
    // run.c reads a C string, so a NUL ends its text; a served message's NUL is encoded (its
    // byte fallback), not an end that drops the rest of the prompt unseen.
    std::vector<int32_t> ids;
    if (add_bos && bos_id() >= 0) ids.push_back(kBos);
    if (!parse_special || eos_id() < 0) {
      EncodeSegment(text, &ids);
      return ids;
    }
    for (const internal::TextSegment& seg : internal::SplitOnLiterals(text, {"<s>", "</s>"})) {
      if (seg.special_index == 0) {
        ids.push_back(kBos);
      } else if (seg.special_index == 1) {
        ids.push_back(kEos);
      } else {
        EncodeSegment(seg.text, &ids);
      }
    }
    return ids;
  }

  std::string Decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    int32_t prev = -1;
    for (int32_t id : ids) {
      const bool special = id == bos_id() || id == eos_id();
      if (!(skip_special && special)) out += TokenBytes(prev, id);
      prev = id;
    }
    return out;
  }

  std::string TokenBytes(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    if (prev < 0 && id == bos_id()) return "";  // a leading BOS prints nothing
    std::string_view piece = pieces_[id];
    piece = piece.substr(0, piece.find('\0'));  // printf("%s")
    if (prev == kBos && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    std::string bytes(piece);
    if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' &&
        HexValue(piece[3]) >= 0 && HexValue(piece[4]) >= 0) {
      bytes = std::string(1, static_cast<char>(HexValue(piece[3]) * 16 + HexValue(piece[4])));
    }
    // safe_printf: a lone byte that is neither printable nor whitespace is not printed.
    if (bytes.size() == 1 && !IsPrintOrSpace(static_cast<unsigned char>(bytes[0]))) return "";
    return bytes;
  }

  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int32_t bos_id() const override { return vocab_size() > kBos ? kBos : -1; }
  int32_t eos_id() const override { return vocab_size() > kEos ? kEos : -1; }

  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    auto it = piece_to_id_.find(piece);
    if (it == piece_to_id_.end()) return std::nullopt;
    return it->second;
  }

 private:
  int32_t Lookup(std::string_view piece) const {
    auto it = piece_to_id_.find(piece);
    return it == piece_to_id_.end() ? -1 : it->second;
  }

  // run.c's byte fallback, byte + 3 (the <0xHH> pieces of a SentencePiece export), or <unk>
  // (0) when the vocabulary is too small to hold that id: run.c would index past its table.
  int32_t ByteFallbackId(unsigned char c) const {
    const int32_t id = static_cast<int32_t>(c) + 3;
    return id < vocab_size() ? id : 0;
  }

  // Appends run.c's tokens for `text` (no BOS/EOS).
  void EncodeSegment(std::string_view text, std::vector<int32_t>* out) const {
    std::vector<int32_t> ids;
    if (!text.empty() && dummy_prefix_id_ >= 0) ids.push_back(dummy_prefix_id_);
    // Code points (at most 4 bytes, as run.c groups continuation bytes), else byte fallback.
    size_t start = 0;
    while (start < text.size()) {
      size_t end = start + 1;
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80 &&
             end - start < 4) {
        ++end;
      }
      const std::string_view cp = text.substr(start, end - start);
      if (const int32_t id = Lookup(cp); id >= 0) {
        ids.push_back(id);
      } else {
        for (unsigned char c : cp) ids.push_back(ByteFallbackId(c));
      }
      start = end;
    }
    MergePairs(&ids);
    out->insert(out->end(), ids.begin(), ids.end());
  }

  // run.c's merge loop: best score first, leftmost on ties; scores <= -1e10 never merge.
  void MergePairs(std::vector<int32_t>* ids) const {
    const int n = static_cast<int>(ids->size());
    if (n < 2) return;
    std::vector<int32_t> id = *ids;
    std::vector<int> next(n), prev(n);
    for (int i = 0; i < n; ++i) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    struct Candidate {
      float score;
      int left;
      int32_t left_id, right_id, merged_id;
      bool operator<(const Candidate& o) const {  // top(): highest score, then leftmost
        if (score != o.score) return score < o.score;
        return left > o.left;
      }
    };
    std::priority_queue<Candidate> queue;
    std::string buffer;
    auto push = [&](int left) {
      const int right = next[left];
      if (right < 0) return;
      buffer.assign(pieces_[id[left]]);
      buffer.append(pieces_[id[right]]);
      const int32_t merged = Lookup(buffer);
      if (merged >= 0 && scores_[merged] > -1e10f) {
        queue.push({scores_[merged], left, id[left], id[right], merged});
      }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      const int right = next[c.left];
      if (id[c.left] != c.left_id || right < 0 || id[right] != c.right_id) continue;  // stale
      id[c.left] = c.merged_id;
      id[right] = -1;
      next[c.left] = next[right];
      if (next[right] >= 0) prev[next[right]] = c.left;
      if (prev[c.left] >= 0) push(prev[c.left]);
      push(c.left);
    }
    ids->clear();
    for (int i = 0; i >= 0; i = next[i]) ids->push_back(id[i]);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> piece_to_id_;
  int32_t dummy_prefix_id_ = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                                int vocab_size) {
  RECALL_ASSIGN_OR_RETURN(const std::string data, internal::ReadFileBytes(path));
  size_t pos = 0;
  auto read_i32 = [&](int32_t* v) {
    if (data.size() - pos < 4) return false;
    std::memcpy(v, data.data() + pos, 4);
    pos += 4;
    return true;
  };
  int32_t max_token_length = 0;
  if (!read_i32(&max_token_length)) {
    return absl::DataLossError(absl::StrCat(path, ": ", data.size(),
                                            " bytes is too short for the llama2.c tokenizer "
                                            "header (int32 max_token_length)"));
  }
  if (max_token_length < 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": negative max_token_length ", max_token_length));
  }
  std::vector<std::string> pieces;
  std::vector<float> scores;
  const bool until_eof = vocab_size <= 0;
  while (until_eof ? pos < data.size() : static_cast<int>(pieces.size()) < vocab_size) {
    const size_t index = pieces.size();
    const std::string where = until_eof ? absl::StrCat("token ", index)
                                        : absl::StrCat("token ", index, " of ", vocab_size);
    int32_t score_bits = 0;
    int32_t length = 0;
    if (!read_i32(&score_bits) || !read_i32(&length)) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated at ", where, " (no score/length; file is ", data.size(), " bytes)"));
    }
    if (length < 0 || static_cast<size_t>(length) > data.size() - pos) {
      return absl::DataLossError(absl::StrCat(path, ": ", where, " has length ", length,
                                              " but only ", data.size() - pos,
                                              " bytes remain (truncated or corrupt file)"));
    }
    float score;
    std::memcpy(&score, &score_bits, 4);
    scores.push_back(score);
    pieces.emplace_back(data.substr(pos, length));
    pos += length;
  }
  if (pieces.empty()) {
    return absl::DataLossError(absl::StrCat(path, ": no tokens after the header"));
  }
  if (pos != data.size()) {
    // tokenizer.py writes exactly the model's vocabulary: more tokens mean another model's
    // tokenizer (or a wrong vocab_size in the checkpoint header).
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds more than vocab_size = ", vocab_size, " tokens (",
                     data.size() - pos, " bytes follow token ", vocab_size - 1,
                     "): the tokenizer does not match the model's vocab_size"));
  }
  return std::unique_ptr<Tokenizer>(
      std::make_unique<Llama2cTokenizer>(std::move(pieces), std::move(scores)));
}

}  // namespace recall::model
