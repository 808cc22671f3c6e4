#include "common/tls/certificate.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"

namespace recall::tls {
namespace {

// "Nov 28 10:00:00 2026 GMT".
std::string TimeText(const ASN1_TIME* t) {
  BIO* out = BIO_new(BIO_s_mem());
  if (out == nullptr) return "?";
  ASN1_TIME_print(out, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(out, &data);
  std::string text = n > 0 && data != nullptr ? std::string(data, static_cast<size_t>(n)) : "?";
  BIO_free(out);
  return text;
}

// FailedPrecondition naming `which` certificate of `path` when it is not valid now, and
// what follows from that (`consequence`).
absl::Status CheckDates(X509* cert, const std::string& flag, const std::string& path,
                        const std::string& which, const std::string& consequence) {
  const ASN1_TIME* not_before = X509_get0_notBefore(cert);
  const ASN1_TIME* not_after = X509_get0_notAfter(cert);
  if (X509_cmp_current_time(not_after) < 0) {
    return absl::FailedPreconditionError(absl::StrCat(flag, ": ", which, " in ", path,
                                                      " expired on ", TimeText(not_after), "; ",
                                                      consequence, " (renew it)"));
  }
  if (X509_cmp_current_time(not_before) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(flag, ": ", which, " in ", path,
                                                      " is not valid before ", TimeText(not_before),
                                                      "; ", consequence, " until then"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCertificateDates(const std::string& flag, const std::string& path,
                                   const std::string& pem) {
  BIO* in = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (in == nullptr) return absl::ResourceExhaustedError("out of memory");
  absl::Status status;
  int read = 0;  // the chain's certificates, the server's first
  while (status.ok()) {
    X509* cert = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
    if (cert == nullptr) break;
    const std::string which =
        read == 0 ? "the certificate" : absl::StrCat("certificate ", read + 1);
    ++read;
    status = CheckDates(cert, flag, path, which, "every client would refuse it");
    X509_free(cert);
  }
  BIO_free(in);
  ERR_clear_error();  // the read that ended the chain leaves its error queued
  if (read == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate OpenSSL can read"));
  }
  return status;
}

absl::Status CheckHoldsCertificate(const std::string& flag, const std::string& path,
                                   const std::string& pem) {
  BIO* in = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (in == nullptr) return absl::ResourceExhaustedError("out of memory");
  int read = 0;
  bool valid = false;
  absl::Status first_invalid;
  while (!valid) {
    X509* cert = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
    if (cert == nullptr) break;
    ++read;
    absl::Status st = CheckDates(cert, flag, path,
                                 read == 1 ? "the certificate" : absl::StrCat("certificate ", read),
                                 "no certificate it signed can be verified");
    X509_free(cert);
    valid = st.ok();
    if (first_invalid.ok()) first_invalid = std::move(st);
  }
  BIO_free(in);
  ERR_clear_error();
  if (read == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate OpenSSL can read"));
  }
  if (valid) return absl::OkStatus();
  // (A bundle of expired certificates only was taken: every peer it was to verify failed.)
  return absl::FailedPreconditionError(absl::StrCat(
      first_invalid.message(),
      read > 1 ? absl::StrCat("; none of its ", read, " certificates is valid now") : ""));
}

absl::Status CheckKeyMatchesCertificate(const std::string& key_path, const std::string& key_pem,
                                        const std::string& cert_path, const std::string& cert_pem) {
  BIO* key_in = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  BIO* cert_in = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  // A callback that gives no passphrase: OpenSSL's default asks the terminal for one (an
  // encrypted key would stop the start at a prompt).
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  EVP_PKEY* key = key_in == nullptr
                      ? nullptr
                      : PEM_read_bio_PrivateKey(key_in, nullptr, no_passphrase, nullptr);
  X509* cert = cert_in == nullptr ? nullptr : PEM_read_bio_X509(cert_in, nullptr, nullptr, nullptr);
  absl::Status status;
  if (key == nullptr) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: ", key_path,
        " holds no PEM private key OpenSSL can read (an unencrypted PEM key is needed)"));
  } else if (cert != nullptr && X509_check_private_key(cert, key) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: ", key_path, " is not the key of the certificate in --tls-cert ", cert_path));
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  BIO_free(cert_in);
  BIO_free(key_in);
  ERR_clear_error();
  return status;
}

}  // namespace recall::tls
