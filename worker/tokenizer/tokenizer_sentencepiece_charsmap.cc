#include "worker/tokenizer/tokenizer_sentencepiece_charsmap.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"

namespace recall::model::internal {
namespace {

// One field of a protocol buffer: its number, and its bytes when length-delimited.
struct Field {
  uint32_t number = 0;
  int wire_type = 0;
  std::string_view bytes;
};

// Reads protocol buffer fields from `data`; nullopt past a malformed one.
class WireReader {
 public:
  explicit WireReader(std::string_view data) : data_(data) {}
  bool done() const { return pos_ >= data_.size(); }
  std::optional<Field> Next() {
    const std::optional<uint64_t> key = Varint();
    if (!key.has_value()) return std::nullopt;
    Field f;
    f.number = static_cast<uint32_t>(*key >> 3);
    f.wire_type = static_cast<int>(*key & 7);
    switch (f.wire_type) {
      case 0:
        if (!Varint().has_value()) return std::nullopt;
        return f;
      case 1:
        return Skip(8) ? std::optional<Field>(f) : std::nullopt;
      case 5:
        return Skip(4) ? std::optional<Field>(f) : std::nullopt;
      case 2: {
        const std::optional<uint64_t> len = Varint();
        if (!len.has_value() || *len > data_.size() - pos_) return std::nullopt;
        f.bytes = data_.substr(pos_, *len);
        pos_ += *len;
        return f;
      }
      case 3:  // a group (none in a ModelProto, but the library skips one): to its end
        for (int depth = 1; depth > 0;) {
          const std::optional<uint64_t> inner = Varint();
          if (!inner.has_value()) return std::nullopt;
          const int type = static_cast<int>(*inner & 7);
          if (type == 3) {
            ++depth;
          } else if (type == 4) {
            --depth;
          } else if ((type == 0 && !Varint().has_value()) || (type == 1 && !Skip(8)) ||
                     (type == 5 && !Skip(4)) || type > 5) {
            return std::nullopt;
          } else if (type == 2) {
            const std::optional<uint64_t> len = Varint();
            if (!len.has_value() || !Skip(*len)) return std::nullopt;
          }
        }
        return f;
      default:
        return std::nullopt;
    }
  }

 private:
  std::optional<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && pos_ < data_.size(); shift += 7) {
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return std::nullopt;
  }
  bool Skip(uint64_t n) {
    if (n > data_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  std::string_view data_;
  size_t pos_ = 0;
};

// darts-clone's unit: a node's label and the offset to its children, or a value.
bool HasLeaf(uint32_t u) { return ((u >> 8) & 1) != 0; }
uint32_t Value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t Label(uint32_t u) { return u & ((1u << 31) | 0xff); }
uint32_t Offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

// The fault of one table (the library's layout: a little-endian uint32 trie size, the trie's
// units, then the NUL-terminated replacement strings), or "".
std::string CharsMapFault(std::string_view blob) {
  if (blob.empty()) return "";
  if (blob.size() <= 4) return absl::StrCat("holds ", blob.size(), " bytes, no table");
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<uint8_t>(blob[i]);
  if (trie_bytes >= blob.size() - 4) {
    return absl::StrCat("its trie of ", trie_bytes, " bytes does not fit its ", blob.size() - 4,
                        " bytes");
  }
  const size_t n = trie_bytes / 4;
  if (n == 0) return "its trie is empty";
  std::vector<uint32_t> units(n);
  std::memcpy(units.data(), blob.data() + 4, n * 4);  // little-endian, as the library reads it
  const std::string_view strings = blob.substr(4 + trie_bytes);
  // Every state an input can reach (darts-clone's commonPrefixSearch): the unit a byte leads
  // to is in the state's block of 256. States may be shared (darts-clone merges common
  // suffixes), but a state reached again on its own path is a cycle, along which an input
  // finds matches without end; the normalizer keeps 32 matches of one input in an array on
  // its stack and reads as many as the search counts. A depth-first walk: each state's most
  // matches on any path from it, a cycle when a state on the path is reached.
  constexpr int kMaxMatches = 32;  // sentencepiece's kMaxTrieResultsSize
  const auto outside = [n](uint32_t state) { return (static_cast<uint64_t>(state) | 0xff) >= n; };
  enum : uint8_t { kNew, kOnPath, kDone };
  std::vector<uint8_t> color(n, kNew);
  std::vector<uint8_t> most(n, 0);  // kDone: the most matches of an input from this state on
  struct Frame {
    uint32_t state;
    uint32_t c = 0;  // the next byte to try
    int best = 0;    // the most matches below it so far
    int edge = 0;    // 1 when the byte that led here was a match
  };
  const uint32_t root = Offset(units[0]);
  if (outside(root)) return absl::StrCat("its trie leads past its ", n, " units (to ", root, ")");
  std::vector<Frame> path = {{root}};
  color[root] = kOnPath;
  while (!path.empty()) {
    Frame& f = path.back();
    if (f.c == 256) {
      color[f.state] = kDone;
      most[f.state] = static_cast<uint8_t>(f.best);
      const int up = f.edge + f.best;
      path.pop_back();
      if (!path.empty()) path.back().best = std::max(path.back().best, up);
      if (up > kMaxMatches) {
        return absl::StrCat("an input matches more than ", kMaxMatches, " of its entries");
      }
      continue;
    }
    const uint32_t c = f.c++;
    const uint32_t unit = units[f.state ^ c];
    if (Label(unit) != c) continue;
    const uint32_t next = (f.state ^ c) ^ Offset(unit);
    if (outside(next)) return absl::StrCat("its trie leads past its ", n, " units (to ", next, ")");
    const int edge = HasLeaf(unit) ? 1 : 0;
    if (edge != 0) {
      const uint32_t value = Value(units[next]);
      if (value >= strings.size() || strings.find('\0', value) == std::string_view::npos) {
        return absl::StrCat("its trie names a string at byte ", value, " of its ", strings.size(),
                            " bytes of strings, which does not end there");
      }
    }
    if (color[next] == kOnPath) return absl::StrCat("its trie has a cycle (at unit ", next, ")");
    if (color[next] == kDone) {
      f.best = std::max(f.best, edge + most[next]);
      continue;
    }
    color[next] = kOnPath;
    path.push_back({next, 0, 0, edge});
  }
  return "";
}

}  // namespace

absl::Status CheckCharsMaps(std::string_view model) {
  WireReader top(model);
  while (!top.done()) {
    const std::optional<Field> f = top.Next();
    if (!f.has_value()) return absl::OkStatus();  // not a protocol buffer: the library says so
    if (f->wire_type != 2 || (f->number != 3 && f->number != 5)) continue;
    WireReader spec(f->bytes);
    while (!spec.done()) {
      const std::optional<Field> g = spec.Next();
      if (!g.has_value()) break;
      if (g->wire_type != 2 || g->number != 2) continue;
      if (const std::string fault = CharsMapFault(g->bytes); !fault.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(f->number == 3 ? "normalizer_spec" : "denormalizer_spec",
                         ".precompiled_charsmap: ", fault));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::model::internal
