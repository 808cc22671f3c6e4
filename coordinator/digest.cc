#include "coordinator/digest.h"

#include <openssl/evp.h>

#include <cstdint>

#include "common/logging.h"

namespace recall::coordinator {
namespace {

EVP_MD_CTX* Ctx(void* p) { return static_cast<EVP_MD_CTX*>(p); }

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  RECALL_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(Ctx(ctx_), EVP_sha256(), nullptr) == 1)
      << "SHA-256 init failed";
}

Sha256::~Sha256() { EVP_MD_CTX_free(Ctx(ctx_)); }

Sha256::Sha256(const Sha256& other) : ctx_(EVP_MD_CTX_new()) {
  RECALL_CHECK(ctx_ != nullptr && EVP_MD_CTX_copy_ex(Ctx(ctx_), Ctx(other.ctx_)) == 1)
      << "SHA-256 copy failed";
}

Sha256& Sha256::Add(std::string_view bytes) {
  RECALL_CHECK(EVP_DigestUpdate(Ctx(ctx_), bytes.data(), bytes.size()) == 1)
      << "SHA-256 update failed";
  return *this;
}

Sha256& Sha256::AddField(std::string_view part) {
  char size[8];
  const uint64_t n = part.size();
  for (int b = 0; b < 8; ++b) size[b] = static_cast<char>((n >> (8 * b)) & 0xFF);
  return Add(std::string_view(size, sizeof size)).Add(part);
}

std::string Sha256::Digest() const {
  Sha256 copy(*this);  // finishing consumes the context
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  RECALL_CHECK(EVP_DigestFinal_ex(Ctx(copy.ctx_), md, &n) == 1) << "SHA-256 final failed";
  return std::string(reinterpret_cast<const char*>(md), n);
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(kDigits[u >> 4]);
    out.push_back(kDigits[u & 15]);
  }
  return out;
}

}  // namespace recall::coordinator
