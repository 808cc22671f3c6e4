// Tokenizers: one interface, three formats.
//   - llama2.c tokenizer.bin (scores + pieces; run.c's greedy merge by score)
//   - SentencePiece tokenizer.model (through libsentencepiece)
//   - Hugging Face tokenizer.json, byte-level BPE (pre-tokenizer regex, merges, added tokens)
// Thread safety: const methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`. With add_bos, the BOS id comes first (when the vocabulary has one).
  // Special/added tokens written literally in `text` (e.g. "<|im_start|>") are recognised as
  // single tokens when parse_special is true.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                                      bool parse_special = true) const = 0;

  // The text of a whole id sequence (as the reference library decodes it; a leading BOS
  // is skipped, special tokens are rendered as their text unless skip_special).
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  // The bytes token `id` contributes when it follows `prev` (streaming). The bytes of one
  // character may be split over several tokens; use TokenStreamDecoder to get whole UTF-8.
  virtual std::string TokenBytes(int32_t prev, int32_t id) const = 0;

  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  // The id of a piece written exactly as in the vocabulary (e.g. "<|im_end|>"), if any.
  virtual std::optional<int32_t> PieceToId(std::string_view piece) const = 0;
};

// Buffers partial UTF-8 between tokens so a stream of deltas is always valid UTF-8.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Returns the complete characters that `id` finishes (may be empty).
  std::string Next(int32_t id);
  // Whatever is still buffered (an incomplete sequence at the end of generation).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_ = -1;
  std::string pending_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                                int vocab_size);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& tokenizer_json);

// By file name: *.model -> SentencePiece, *.json -> Hugging Face, otherwise llama2.c
// (vocab_size is needed only for the llama2.c format). A directory means
// dir/tokenizer.json, else dir/tokenizer.model.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path,
                                                         int vocab_size = 0);

}  // namespace recall::model
