// The pre-tokenizer of a Hugging Face byte-level BPE tokenizer.json: cuts text into the
// words that BPE encodes separately.
//
// Supported "pre_tokenizer" objects (and a "Sequence" of them, applied in order):
//   Split     {pattern: {Regex|String}, behavior: Removed|Isolated|MergedWithPrevious|
//              MergedWithNext|Contiguous, invert}
//   Digits    {individual_digits}: numeric characters (\p{N}) split off
//   ByteLevel {add_prefix_space, use_regex}: the GPT-2 regex split; must come last (later
//              splits would see the byte-to-unicode alphabet).
// Anything else is InvalidArgument naming the type. The byte-to-unicode mapping itself is
// implicit: words stay raw bytes and the BPE model works on bytes.
// Thread safety: Split is const and safe to call concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "worker/tokenizer/tokenizer_hf_regex.h"

namespace recall::model::hf {

// The GPT-2 pre-tokenization regex (ByteLevel with use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // From the tokenizer.json "pre_tokenizer" value. InvalidArgument for unsupported types or
  // options, bad regexes, or when no ByteLevel step is present.
  static absl::StatusOr<PreTokenizer> FromJson(const nlohmann::json& json);

  // Appends the words of `text` (never empty) to `words`.
  void Split(std::string_view text, std::vector<std::string>* words) const;

 private:
  struct Step {
    bool add_prefix_space = false;       // ByteLevel: prepend ' ' unless the piece starts with one
    std::shared_ptr<const Regex> regex;  // null: no splitting
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };

  absl::Status AddStep(const nlohmann::json& json);

  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace recall::model::hf
