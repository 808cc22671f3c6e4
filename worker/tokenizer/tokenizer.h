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
  // Every id that ends a sequence: eos_id() and, where the model names several (a Hugging
  // Face eos_token_id list), the others too. Empty if none.
  virtual std::vector<int32_t> end_ids() const {
    return eos_id() >= 0 ? std::vector<int32_t>{eos_id()} : std::vector<int32_t>{};
  }
  // The id of a piece written exactly as in the vocabulary (e.g. "<|im_end|>"), if any.
  virtual std::optional<int32_t> PieceToId(std::string_view piece) const = 0;
};

// Buffers partial UTF-8 between tokens so a stream of deltas is always valid UTF-8.
// Bytes that can never form a character come out as U+FFFD; Flush returns an incomplete
// tail as U+FFFD. Feed every id, BOS included: TokenBytes sees the previous id (prev is -1
// for the first), so the concatenated deltas equal Decode(ids) (for SentencePiece when the
// ids start with BOS: otherwise its Decode also drops the first piece's leading space).
// Thread safety: one decoder per stream (not thread safe); the tokenizer may be shared.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Returns the complete characters that `id` finishes (may be empty).
  std::string Next(int32_t id);
  // Whatever is still buffered (an incomplete sequence at the end of generation).
  std::string Flush();
  // Whether part of a character is buffered (the text so far ends inside a token's bytes).
  bool holding() const { return !pending_.empty(); }

 private:
  const Tokenizer& tokenizer_;
  int32_t prev_ = -1;
  std::string pending_;
};

// Loaders. Errors name the file: NotFound when it is missing, DataLoss when it is
// truncated or unparsable, InvalidArgument when it is well-formed but malformed or uses an
// unsupported feature.
//
// llama2.c tokenizer.bin (tokenizer_llama2c.cc): Encode is run.c's encode, Decode/TokenBytes
// what run.c prints (leading space dropped after BOS, "<0xHH>" pieces as raw bytes,
// unprintable single bytes dropped). vocab_size <= 0 reads tokens up to the end of file;
// otherwise the file must hold exactly vocab_size tokens (InvalidArgument when more follow).
// BOS = 1, EOS = 2; a byte whose fallback id (byte + 3) is past the vocabulary encodes as 0.
// SentencePiece (tokenizer_sentencepiece.cc): Encode/Decode are libsentencepiece's; Decode
// always drops control tokens. TokenBytes drops a piece's leading space only after BOS.
// end_ids() has its EOS and, beside a Hugging Face model's files, every id of their
// eos_token_id (as for tokenizer.json, below).
// For both: with parse_special, literal "<s>"/"</s>" in the text become BOS/EOS and the text
// between them is encoded segment by segment (how Meta's Llama 2 chat code encodes turns).
// Hugging Face tokenizer.json (tokenizer_hf.cc): byte-level BPE only. bos_id() is what the
// post_processor puts first (-1 if nothing, e.g. SmolLM2) and add_bos adds exactly that;
// eos_id() comes from generation_config.json / config.json / tokenizer_config.json beside
// the file (-1 if none); end_ids() has every id of an eos_token_id list there. Decode replaces
// ill-formed UTF-8 with U+FFFD, as the library does. Its ids must be below 2^24 and the file's size
// (the id table is sized by the largest), and the JSON may nest at most json_limits::kMaxDepth
// levels.
// The eos_token_id of the model files beside tokenizer.json or tokenizer.model
// (generation_config.json, else config.json) is read by one reader (tokenizer_eos_ids.h):
// an id that is not a token of the vocabulary, or a generation_config.json that is not a
// JSON object or whose eos_token_id names none, is InvalidArgument naming the file and field.
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
