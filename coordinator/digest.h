// SHA-256 (OpenSSL's libcrypto), for the store's named records: digests that every
// coordinator computes alike (absl's hashes are salted per process).
#pragma once

#include <string>
#include <string_view>

namespace recall::coordinator {

// Feeds parts and gives their SHA-256 (32 bytes); copyable, so a chain of prefixes is one pass.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256& other);
  Sha256& operator=(const Sha256&) = delete;

  Sha256& Add(std::string_view bytes);
  // The part's length (8 bytes) then the part: parts that concatenate alike stay apart.
  Sha256& AddField(std::string_view part);
  // The digest of what was added so far (this goes on accepting parts).
  std::string Digest() const;

 private:
  void* ctx_;  // EVP_MD_CTX
};

// `bytes` as lower-case hex digits.
std::string Hex(std::string_view bytes);

}  // namespace recall::coordinator
