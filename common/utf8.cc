#include "common/utf8.h"

#include <cstdint>

namespace recall::utf8 {
namespace {

// The allowed range of the second byte for a lead byte (Table 3-7); later bytes are 80..BF.
struct LeadInfo {
  size_t length;  // 0: not a lead byte
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Sequence NextSequence(std::string_view text, size_t pos) {
  const LeadInfo lead = Lead(static_cast<uint8_t>(text[pos]));
  if (lead.length == 0) return {SequenceKind::kInvalid, 1};
  if (lead.length == 1) return {SequenceKind::kValid, 1};
  for (size_t i = 1; i < lead.length; ++i) {
    if (pos + i >= text.size()) return {SequenceKind::kIncomplete, i};
    const uint8_t b = static_cast<uint8_t>(text[pos + i]);
    const uint8_t lo = i == 1 ? lead.second_lo : 0x80;
    const uint8_t hi = i == 1 ? lead.second_hi : 0xBF;
    if (b < lo || b > hi) return {SequenceKind::kInvalid, i};
  }
  return {SequenceKind::kValid, lead.length};
}

std::string ToValidLossy(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Sequence seq = NextSequence(text, pos);
    if (seq.kind == SequenceKind::kValid) {
      out.append(text.substr(pos, seq.length));
    } else {
      out.append(kReplacementChar);
    }
    pos += seq.length;
  }
  return out;
}

bool IsValid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Sequence seq = NextSequence(text, pos);
    if (seq.kind != SequenceKind::kValid) return false;
    pos += seq.length;
  }
  return true;
}

void AppendCodePoint(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int32_t DecodeCodePoint(std::string_view text, size_t* pos) {
  const Sequence seq = NextSequence(text, *pos);
  if (seq.kind != SequenceKind::kValid) {
    ++*pos;
    return -1;
  }
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[*pos + i]); };
  int32_t cp;
  switch (seq.length) {
    case 1:
      cp = byte(0);
      break;
    case 2:
      cp = ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
      break;
    case 3:
      cp = ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
      break;
    default:
      cp = ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) |
           (byte(3) & 0x3F);
      break;
  }
  *pos += seq.length;
  return cp;
}

}  // namespace recall::utf8
