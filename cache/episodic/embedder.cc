#include "cache/episodic/embedder.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recall::cache::episodic {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

// murmur3's 64-bit finaliser: spreads FNV's weak low bits over the whole word.
uint64_t Fmix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

// FNV-1a over the bytes, starting from a seed-dependent basis, then finalised.
uint64_t HashWord(std::string_view word, uint64_t seed) {
  uint64_t h = kFnvOffset ^ Fmix64(seed + 0x9e3779b97f4a7c15ULL);
  for (char c : word) {
    h ^= static_cast<unsigned char>(c);
    h *= kFnvPrime;
  }
  return Fmix64(h);
}

// Seed-independent key for document frequencies.
uint64_t WordKey(std::string_view word) { return HashWord(word, 0); }

bool IsWordByte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

char ToLower(unsigned char c) {
  return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HashedTfIdfEmbedder>> HashedTfIdfEmbedder::Create(
    const HashedTfIdfOptions& options) {
  if (options.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hashed_tfidf: dim must be >= 1, got ", options.dim));
  }
  return std::unique_ptr<HashedTfIdfEmbedder>(new HashedTfIdfEmbedder(options));
}

std::vector<std::string> HashedTfIdfEmbedder::Tokenize(std::string_view text) {
  std::vector<std::string> words;
  std::string current;
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (IsWordByte(c)) {
      current += ToLower(c);
    } else if (!current.empty()) {
      words.push_back(std::move(current));
      current.clear();
    }
  }
  if (!current.empty()) words.push_back(std::move(current));
  return words;
}

void HashedTfIdfEmbedder::Fit(std::span<const std::string> documents) {
  document_frequency_.clear();
  n_documents_ = static_cast<int64_t>(documents.size());
  std::unordered_set<uint64_t> seen;
  for (const std::string& doc : documents) {
    seen.clear();
    for (const std::string& word : Tokenize(doc)) seen.insert(WordKey(word));
    for (uint64_t key : seen) ++document_frequency_[key];
  }
}

double HashedTfIdfEmbedder::IdfOfKey(uint64_t key) const {
  if (n_documents_ == 0) return 1.0;
  const auto it = document_frequency_.find(key);
  const double df = it == document_frequency_.end() ? 0.0 : static_cast<double>(it->second);
  return std::log((1.0 + static_cast<double>(n_documents_)) / (1.0 + df)) + 1.0;
}

double HashedTfIdfEmbedder::Idf(std::string_view word) const { return IdfOfKey(WordKey(word)); }

absl::StatusOr<std::vector<float>> HashedTfIdfEmbedder::Embed(std::string_view text) const {
  // Term frequencies by word; the bucket hash depends on the seed, the idf key does not.
  struct Term {
    uint64_t bucket_hash = 0;
    int64_t tf = 0;
  };
  std::unordered_map<uint64_t, Term> terms;  // word key -> term
  for (const std::string& word : Tokenize(text)) {
    Term& t = terms[WordKey(word)];
    if (t.tf == 0) t.bucket_hash = HashWord(word, options_.seed);
    ++t.tf;
  }
  // Accumulate in double, in key order, so the rounding is the same on every platform.
  std::vector<std::pair<uint64_t, Term>> sorted(terms.begin(), terms.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<double> acc(static_cast<size_t>(options_.dim), 0.0);
  for (const auto& [key, t] : sorted) {
    const double weight = (1.0 + std::log(static_cast<double>(t.tf))) * IdfOfKey(key);
    const size_t bucket =
        static_cast<size_t>((t.bucket_hash >> 1) % static_cast<uint64_t>(options_.dim));
    acc[bucket] += (t.bucket_hash & 1) == 0 ? weight : -weight;
  }
  double norm2 = 0.0;
  for (double v : acc) norm2 += v * v;
  std::vector<float> out(acc.size(), 0.0f);
  if (norm2 > 0.0) {
    const double inv = 1.0 / std::sqrt(norm2);
    for (size_t i = 0; i < acc.size(); ++i) out[i] = static_cast<float>(acc[i] * inv);
  }
  return out;
}

}  // namespace recall::cache::episodic
