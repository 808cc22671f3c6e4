#include "fuzz/seeds/sentencepiece_proto.h"

#include <cstring>

namespace recall::fuzz::sp {
namespace {

void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void Tag(int field, int wire_type, std::string* out) {
  Varint((static_cast<uint64_t>(field) << 3) | wire_type, out);
}

void IntField(int field, int64_t v, std::string* out) {
  Tag(field, 0, out);
  Varint(static_cast<uint64_t>(v), out);  // negative int32: ten bytes, as protobuf does
}

void BytesField(int field, const std::string& bytes, std::string* out) {
  Tag(field, 2, out);
  Varint(bytes.size(), out);
  *out += bytes;
}

void FloatField(int field, float v, std::string* out) {
  Tag(field, 5, out);
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}

bool ReadVarint(const std::string& s, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < s.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

std::string ModelProto(ModelType type, const std::vector<Piece>& pieces, bool byte_fallback) {
  std::string out;
  int unk = -1, bos = -1, eos = -1;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.type == kUnknown && unk < 0) unk = static_cast<int>(i);
    if (p.text == "<s>") bos = static_cast<int>(i);
    if (p.text == "</s>") eos = static_cast<int>(i);
    std::string piece;
    BytesField(1, p.text, &piece);
    FloatField(2, p.score, &piece);
    IntField(3, p.type, &piece);
    BytesField(1, piece, &out);
  }
  std::string trainer;
  IntField(3, type, &trainer);
  IntField(4, static_cast<int64_t>(pieces.size()), &trainer);
  IntField(35, byte_fallback ? 1 : 0, &trainer);
  IntField(40, unk, &trainer);
  IntField(41, bos, &trainer);
  IntField(42, eos, &trainer);
  IntField(43, -1, &trainer);
  BytesField(2, trainer, &out);
  std::string normalizer;
  BytesField(1, "identity", &normalizer);
  IntField(3, 1, &normalizer);  // add_dummy_prefix
  IntField(4, 0, &normalizer);  // remove_extra_whitespaces
  IntField(5, 1, &normalizer);  // escape_whitespaces
  BytesField(3, normalizer, &out);
  return out;
}

std::string KeepFirstPieces(const std::string& model, int keep) {
  std::string out;
  int pieces = 0;
  size_t pos = 0;
  while (pos < model.size()) {
    const size_t start = pos;
    uint64_t key = 0, len = 0;
    if (!ReadVarint(model, &pos, &key)) return "";
    switch (key & 7) {
      case 0:
        if (!ReadVarint(model, &pos, &len)) return "";
        break;
      case 1:
        pos += 8;
        break;
      case 2:
        if (!ReadVarint(model, &pos, &len) || len > model.size() - pos) return "";
        pos += len;
        break;
      case 5:
        pos += 4;
        break;
      default:
        return "";
    }
    if (pos > model.size()) return "";
    if ((key >> 3) == 1 && pieces++ >= keep) continue;
    out.append(model, start, pos - start);
  }
  return out;
}

}  // namespace recall::fuzz::sp
