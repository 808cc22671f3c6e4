// A server certificate's dates (common/tls/certificate.h), on self-signed certificates made
// here with OpenSSL (its command line cannot backdate one): valid now passes; expired (the
// server's or a chain's), not yet valid and no certificate at all are refused naming the flag
// and the file.
#include "common/tls/certificate.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <string>

#include "gtest/gtest.h"

namespace recall::tls {
namespace {

// A self-signed P-256 certificate valid from now + from_days to now + to_days, as PEM; its
// private key's PEM in *key_pem when given.
std::string Certificate(long from_days, long to_days, std::string* key_pem = nullptr) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key_pem != nullptr) {
    BIO* k = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr);
    char* kd = nullptr;
    const long kn = BIO_get_mem_data(k, &kd);
    key_pem->assign(kd, static_cast<size_t>(kn));
    BIO_free(k);
  }
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), from_days * 86400);
  X509_gmtime_adj(X509_getm_notAfter(cert), to_days * 86400);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  BIO* out = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(out, cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(out);
  X509_free(cert);
  EVP_PKEY_free(key);
  return pem;
}

TEST(CertificateDatesTest, AValidCertificatePassesAndOthersAreRefusedByName) {
  EXPECT_TRUE(CheckCertificateDates("--tls-cert", "ok.pem", Certificate(-1, 1)).ok());

  const absl::Status expired = CheckCertificateDates("--tls-cert", "old.pem", Certificate(-3, -1));
  EXPECT_EQ(expired.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(expired.message().find("--tls-cert: the certificate in old.pem expired on "),
            std::string::npos)
      << expired;

  const absl::Status early = CheckCertificateDates("--tls-cert", "new.pem", Certificate(1, 3));
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("is not valid before"), std::string::npos) << early;

  // An expired certificate after a valid one (an intermediate of the chain).
  const absl::Status chain =
      CheckCertificateDates("--tls-cert", "chain.pem", Certificate(-1, 1) + Certificate(-3, -1));
  EXPECT_EQ(chain.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(chain.message().find("certificate 2 in chain.pem expired on "), std::string::npos)
      << chain;

  const absl::Status none = CheckCertificateDates("--tls-cert", "key.pem", "not a certificate");
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("key.pem holds no PEM certificate"), std::string::npos) << none;
}

// A CA bundle must hold a certificate; a key must be the certificate's.
TEST(CertificateDatesTest, AnEmptyCaAndAKeyOfAnotherCertificateAreRefusedByName) {
  std::string key, other_key;
  const std::string cert = Certificate(-1, 1, &key);
  Certificate(-1, 1, &other_key);
  EXPECT_TRUE(CheckHoldsCertificate("--tls-client-ca", "ca.pem", cert).ok());
  const absl::Status empty = CheckHoldsCertificate("--tls-client-ca", "ca.pem", "");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "--tls-client-ca: ca.pem holds no PEM certificate OpenSSL can read");
  // A bundle of expired certificates only verifies no one (it was taken); one valid among
  // expired ones passes.
  const absl::Status expired = CheckHoldsCertificate("--tls-client-ca", "old.pem",
                                                     Certificate(-3, -2) + Certificate(-3, -1));
  EXPECT_EQ(expired.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(expired.message().find("--tls-client-ca: the certificate in old.pem expired on "),
            std::string::npos)
      << expired;
  EXPECT_NE(expired.message().find("no certificate it signed can be verified (renew it); none of "
                                   "its 2 certificates is valid now"),
            std::string::npos)
      << expired;
  EXPECT_TRUE(
      CheckHoldsCertificate("--tls-client-ca", "mixed.pem", Certificate(-3, -1) + cert).ok());

  EXPECT_TRUE(CheckKeyMatchesCertificate("key.pem", key, "cert.pem", cert).ok());
  const absl::Status other = CheckKeyMatchesCertificate("other.pem", other_key, "cert.pem", cert);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.message(),
            "--tls-key: other.pem is not the key of the certificate in --tls-cert cert.pem");
  // An encrypted key is refused, not asked a passphrase for on the terminal.
  std::string encrypted;
  {
    BIO* in = BIO_new_mem_buf(key.data(), static_cast<int>(key.size()));
    EVP_PKEY* k = PEM_read_bio_PrivateKey(in, nullptr, nullptr, nullptr);
    BIO* out = BIO_new(BIO_s_mem());
    char pass[] = "secret";
    PEM_write_bio_PrivateKey(out, k, EVP_aes_128_cbc(), nullptr, 0, nullptr, pass);
    char* data = nullptr;
    const long n = BIO_get_mem_data(out, &data);
    encrypted.assign(data, static_cast<size_t>(n));
    BIO_free(out);
    EVP_PKEY_free(k);
    BIO_free(in);
  }
  ASSERT_NE(encrypted.find("ENCRYPTED"), std::string::npos) << encrypted;
  for (const std::string& broken :
       {std::string(), std::string("garbage"), cert, key.substr(0, key.size() / 2), encrypted}) {
    const absl::Status st = CheckKeyMatchesCertificate("bad.pem", broken, "cert.pem", cert);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("--tls-key: bad.pem holds no PEM private key"), std::string::npos)
        << st;
  }
}

}  // namespace
}  // namespace recall::tls
