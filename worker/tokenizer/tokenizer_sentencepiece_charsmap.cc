#include "worker/tokenizer/tokenizer_sentencepiece_charsmap.h"

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
      default:
        return std::nullopt;  // groups: not in a ModelProto
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
  bool Skip(size_t n) {
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
  // Every state an input can reach: the unit a byte leads to is in the state's block of 256.
  std::vector<bool> seen(n, false);
  std::vector<uint32_t> todo = {Offset(units[0])};
  while (!todo.empty()) {
    const uint32_t state = todo.back();
    todo.pop_back();
    if ((static_cast<uint64_t>(state) | 0xff) >= n) {
      return absl::StrCat("its trie leads past its ", n, " units (to ", state | 0xff, ")");
    }
    if (seen[state]) continue;
    seen[state] = true;
    for (uint32_t c = 0; c < 256; ++c) {
      const uint32_t unit = units[state ^ c];
      if (Label(unit) != c) continue;
      const uint32_t next = (state ^ c) ^ Offset(unit);
      if (HasLeaf(unit)) {
        if (next >= n) return absl::StrCat("its trie leads past its ", n, " units (to ", next, ")");
        const uint32_t value = Value(units[next]);
        if (value >= strings.size() || strings.find('\0', value) == std::string_view::npos) {
          return absl::StrCat("its trie names a string at byte ", value, " of its ", strings.size(),
                              " bytes of strings, which does not end there");
        }
      }
      todo.push_back(next);
    }
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
