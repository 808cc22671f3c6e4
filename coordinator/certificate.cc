#include "coordinator/certificate.h"

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/str_cat.h"

namespace recall::coordinator {
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

}  // namespace

absl::Status CheckCertificateDates(const std::string& flag, const std::string& path,
                                   const std::string& pem) {
  BIO* in = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (in == nullptr) return absl::ResourceExhaustedError("out of memory");
  X509* cert = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate OpenSSL can read"));
  }
  absl::Status status;
  const ASN1_TIME* not_before = X509_get0_notBefore(cert);
  const ASN1_TIME* not_after = X509_get0_notAfter(cert);
  if (X509_cmp_current_time(not_after) < 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat(flag, ": the certificate in ", path, " expired on ", TimeText(not_after),
                     "; every client would refuse it (renew it)"));
  } else if (X509_cmp_current_time(not_before) > 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat(flag, ": the certificate in ", path, " is not valid before ",
                     TimeText(not_before), "; every client would refuse it until then"));
  }
  X509_free(cert);
  return status;
}

}  // namespace recall::coordinator
