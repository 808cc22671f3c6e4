// Embedder: text -> fixed-size vector, for clustering windows into episodes and routing user
// turns to them (EpiCache steps 2 and "online").
//
// Contract for every implementation:
//  - Embed returns exactly dim() floats, L2-normalised (norm 1 up to float rounding), EXCEPT
//    that a text with nothing to embed (e.g. no words) gives the all-zero vector, which stays
//    zero. Callers must treat a zero embedding as "no information" (RouteToEpisode returns -1
//    for it).
//  - Embed may fail (a model-backed embedder runs a forward pass); the Status says why.
//  - Embed is const and must be safe to call from several threads at once; anything that
//    changes an embedder's state (e.g. HashedTfIdfEmbedder::Fit) is not, and must not run
//    concurrently with Embed.
//
// HashedTfIdfEmbedder is the dependency-free lexical fallback (the default is mean-pooled
// hidden states of the served model, written against this same interface):
//  - Words: maximal runs of ASCII letters and digits, lowercased; bytes >= 0x80 count as word
//    characters, so UTF-8 text keeps its non-ASCII words (but non-ASCII punctuation such as
//    curly quotes also sticks to the word it touches). Everything else separates words.
//  - Feature hashing: word -> 64-bit hash (FNV-1a + murmur3 finaliser, mixed with `seed`;
//    identical on every platform) -> bucket = (h >> 1) % dim, sign = +1 if h is even else -1.
//  - Term weight (1 + ln tf) * idf(word), tf = occurrences in the text. Before any Fit,
//    idf = 1. Fit(corpus of N documents) sets the smooth idf = ln((1 + N) / (1 + df)) + 1,
//    df = number of documents containing the word (words are keyed by a seed-independent
//    64-bit hash; collisions are ignored). A word unseen in the corpus has df = 0.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::cache::episodic {

class Embedder {
 public:
  virtual ~Embedder() = default;

  // Length of every embedding, >= 1.
  virtual int dim() const = 0;

  // The L2-normalised embedding of `text` (all zeros if `text` has nothing to embed).
  virtual absl::StatusOr<std::vector<float>> Embed(std::string_view text) const = 0;
};

struct HashedTfIdfOptions {
  int dim = 1024;     // number of hash buckets, >= 1
  uint64_t seed = 0;  // changes the word -> (bucket, sign) mapping
};

class HashedTfIdfEmbedder : public Embedder {
 public:
  // InvalidArgument if options.dim < 1 (the message names dim).
  static absl::StatusOr<std::unique_ptr<HashedTfIdfEmbedder>> Create(
      const HashedTfIdfOptions& options);

  // Replaces the document frequencies with those of `documents` (see the contract above).
  // An empty corpus restores idf = 1 for every word.
  void Fit(std::span<const std::string> documents);

  int dim() const override { return options_.dim; }
  absl::StatusOr<std::vector<float>> Embed(std::string_view text) const override;

  // The idf currently applied to `word` (given as it would be tokenised: lowercase).
  double Idf(std::string_view word) const;

  // The words of `text` in order, as Embed sees them.
  static std::vector<std::string> Tokenize(std::string_view text);

 private:
  explicit HashedTfIdfEmbedder(const HashedTfIdfOptions& options) : options_(options) {}
  double IdfOfKey(uint64_t key) const;

  HashedTfIdfOptions options_;
  int64_t n_documents_ = 0;
  std::unordered_map<uint64_t, int64_t> document_frequency_;  // word key -> df
};

}  // namespace recall::cache::episodic
