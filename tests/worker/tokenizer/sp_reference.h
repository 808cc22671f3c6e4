// libsentencepiece called directly, as the reference for the SentencePiece tests. Lives in
// its own translation unit: sentencepiece_processor.h cannot share one with Abseil headers.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace recall::model::testing {

class SentencePieceReference {
 public:
  // Empty `error` on success.
  explicit SentencePieceReference(const std::string& model_path);
  ~SentencePieceReference();

  const std::string& error() const { return error_; }
  std::vector<int> Encode(const std::string& text) const;
  std::string Decode(const std::vector<int>& ids) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string error_;
};

}  // namespace recall::model::testing
