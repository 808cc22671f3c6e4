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

// Trains a SentencePiece model with libsentencepiece's trainer: `flags` as spm_train takes
// them ("--input=... --model_prefix=... --normalization_rule_name=nmt_nfkc"). Empty on
// success, else the trainer's message.
std::string TrainSentencePieceModel(const std::string& flags);

}  // namespace recall::model::testing
