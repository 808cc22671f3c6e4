// A std-only facade over sentencepiece::SentencePieceProcessor.
//
// sentencepiece_processor.h declares `namespace absl { using std::string_view; }`, which
// clashes with Debian's Abseil; so only tokenizer_sentencepiece_processor.cc includes it,
// and that file includes no Abseil header. This facade exposes what the tokenizer needs.
// Thread safety: const methods are safe to call concurrently (as the library's).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace recall::model::internal {

class SentencePieceProcessor {
 public:
  SentencePieceProcessor();
  ~SentencePieceProcessor();
  SentencePieceProcessor(const SentencePieceProcessor&) = delete;
  SentencePieceProcessor& operator=(const SentencePieceProcessor&) = delete;

  // Parses a serialized ModelProto; false with the library's message in *error.
  bool LoadFromSerializedProto(const std::string& data, std::string* error);

  // False with *error on failure.
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;

  int GetPieceSize() const;
  std::string IdToPiece(int id) const;
  int PieceToId(std::string_view piece) const;
  bool IsControl(int id) const;
  bool IsByte(int id) const;
  bool IsUnknown(int id) const;
  int bos_id() const;
  int eos_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace recall::model::internal
