// Just enough of the protobuf wire format to write and cut down SentencePiece models
// (sentencepiece_model.proto's ModelProto) without libprotobuf, for the fuzzers' seeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace recall::fuzz::sp {

// SentencePiece.Type
enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6 };
// TrainerSpec.ModelType
enum ModelType { kUnigram = 1, kBpe = 2 };

struct Piece {
  std::string text;
  float score = 0;
  PieceType type = kNormal;
};

// A ModelProto: the pieces, a trainer_spec (model type, vocab size, byte_fallback, unk, bos,
// eos and pad ids) and an identity normalizer_spec adding a dummy prefix.
std::string ModelProto(ModelType type, const std::vector<Piece>& pieces, bool byte_fallback);

// `model` with only its first `keep` pieces (field 1); every other field as it was. Returns
// "" when `model` is not a well-formed message.
std::string KeepFirstPieces(const std::string& model, int keep);

}  // namespace recall::fuzz::sp
