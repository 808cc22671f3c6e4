// Byte-level BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE"}).
//
// Vocabulary strings are in GPT-2's byte-to-unicode alphabet (a space is "Ġ"); this class
// converts them to raw bytes once, so words are tokenized straight from their bytes.
// Merges are applied as the reference library does: lowest rank first, leftmost on ties.
// With ignore_merges, a word that is itself in the vocabulary is one token.
// Results for short words are cached (bounded).
// Thread safety: Tokenize is const and safe to call concurrently (the cache is locked).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json_fwd.hpp"

namespace recall::model::hf {

// A token id from JSON: an integer in [0, 2^31); InvalidArgument naming `what` otherwise (a
// float or an out-of-range number is refused, never converted).
absl::StatusOr<int32_t> TokenIdFromJson(const nlohmann::json& j, absl::string_view what);

// GPT-2's byte -> code point mapping: printable Latin-1 bytes map to themselves, the others
// to U+0100 upwards.
char32_t ByteToCodePoint(uint8_t byte);

// Converts a byte-level token string to its raw bytes; false if some character is not in
// the byte alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* bytes);

// What the ByteLevel decoder emits for one token: its raw bytes when every character is in
// the byte alphabet, else the token's own UTF-8 text.
std::string ByteLevelDecodeToken(std::string_view token);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // From the "model" object. InvalidArgument when a field is missing or malformed, a merge
  // names a token not in the vocabulary, or an unsupported option is set.
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word (raw bytes).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  // Token string (byte-level alphabet) -> id.
  const StringIdMap& vocab() const { return vocab_; }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void Merge(std::string_view word, std::vector<int32_t>* ids) const;

  StringIdMap vocab_;
  StringIdMap bytes_to_id_;             // raw-byte token -> id (for ignore_merges)
  std::array<int32_t, 256> byte_id_{};  // single byte -> id, -1 if absent
  std::unordered_map<uint64_t, MergeInfo> merges_;
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false;

  static constexpr size_t kCacheCapacity = 65536;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable absl::Mutex mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::model::hf
