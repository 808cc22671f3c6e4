#include "worker/tokenizer/tokenizer_nfc.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/utf8.h"
#include "worker/tokenizer/tokenizer_nfc_tables.h"

namespace recall::model {
namespace {

constexpr int32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr int32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int CombiningClass(int32_t cp) {
  if (cp < 0x300) return 0;
  const auto& table = nfc_tables::kCombiningClasses;
  auto it = std::lower_bound(std::begin(table), std::end(table), static_cast<uint32_t>(cp),
                             [](const auto& e, uint32_t v) { return e.code_point < v; });
  return it != std::end(table) && it->code_point == static_cast<uint32_t>(cp) ? it->ccc : 0;
}

const nfc_tables::Decomposition* FindDecomposition(int32_t cp) {
  const auto& table = nfc_tables::kDecompositions;
  auto it = std::lower_bound(std::begin(table), std::end(table), static_cast<uint32_t>(cp),
                             [](const auto& e, uint32_t v) { return e.code_point < v; });
  return it != std::end(table) && it->code_point == static_cast<uint32_t>(cp) ? &*it : nullptr;
}

void Decompose(int32_t cp, std::vector<int32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const nfc_tables::Decomposition* d = cp >= 0xC0 ? FindDecomposition(cp) : nullptr;
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  Decompose(static_cast<int32_t>(d->first), out);
  if (d->second != 0) Decompose(static_cast<int32_t>(d->second), out);
}

// The primary composite of (a, b), or -1.
int32_t Compose(int32_t a, int32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  static const auto* pairs = [] {
    auto* map = new std::unordered_map<uint64_t, int32_t>();
    for (const auto& d : nfc_tables::kDecompositions) {
      if (d.composes) map->emplace((uint64_t{d.first} << 32) | d.second, d.code_point);
    }
    return map;
  }();
  if (a < 0 || b < 0) return -1;
  auto it = pairs->find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
  return it == pairs->end() ? -1 : it->second;
}

}  // namespace

std::string ToNfc(std::string_view text) {
  // Below U+0300 everything is already NFC: lead bytes 0xCC and up start larger code points.
  if (std::none_of(text.begin(), text.end(),
                   [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return std::string(text);
  }
  // Decompose; an ill-formed byte b is kept as -(b + 1).
  std::vector<int32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const int32_t cp = utf8::DecodeCodePoint(text, &pos);
    if (cp < 0) {
      cps.push_back(-1 - static_cast<unsigned char>(text[start]));
    } else {
      Decompose(cp, &cps);
    }
  }
  // Canonical ordering: stable sort each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (cps[i] < 0 || CombiningClass(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && cps[j] >= 0 && CombiningClass(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](int32_t a, int32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
  // Canonical composition.
  if (!cps.empty()) {
    size_t starter = 0;
    int last_class = cps[0] >= 0 && CombiningClass(cps[0]) != 0 ? 256 : 0;
    size_t out = 1;
    for (size_t i = 1; i < cps.size(); ++i) {
      const int32_t cp = cps[i];
      const int cls = cp < 0 ? 0 : CombiningClass(cp);
      const int32_t composite = Compose(cps[starter], cp);
      if (composite >= 0 && (last_class < cls || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (cls == 0) starter = out;
      last_class = cls;
      cps[out++] = cp;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(text.size());
  for (int32_t cp : cps) {
    if (cp < 0) {
      result.push_back(static_cast<char>(-1 - cp));
    } else {
      utf8::AppendCodePoint(static_cast<char32_t>(cp), &result);
    }
  }
  return result;
}

}  // namespace recall::model
