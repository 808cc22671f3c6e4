// TLS files checked before gRPC or the HTTP server takes them (each says only that it could
// not listen, or "empty address list", after its handshakes failed): a certificate's dates (a
// coordinator started with one that has expired would serve TLS that every client refuses),
// a CA bundle holding a certificate, a key that is its certificate's. The coordinator checks
// its files at start, `recall chat` and `recall sessions` theirs before they connect.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace recall::tls {

// OK when every certificate of `pem` (the file at `path`, given by `flag`: the server's, then
// its chain) is valid now; FailedPrecondition naming the flag, the file, the certificate and
// the date when one has expired or is not valid yet; InvalidArgument when it holds no
// certificate OpenSSL reads.
absl::Status CheckCertificateDates(const std::string& flag, const std::string& path,
                                   const std::string& pem);

// OK when `pem` (the file at `path`, given by `flag`: a CA bundle) holds a certificate
// OpenSSL reads that is valid now; InvalidArgument naming the flag and the file when it holds
// none (an empty or garbage --tls-client-ca started a server whose every client was refused),
// FailedPrecondition naming a certificate's dates when none is valid now (a bundle of expired
// certificates was taken alike).
absl::Status CheckHoldsCertificate(const std::string& flag, const std::string& path,
                                   const std::string& pem);

// OK when `key_pem` (the file at `key_path`, --tls-key) is a private key OpenSSL reads and
// is the key of the first certificate of `cert_pem` (--tls-cert, at `cert_path`);
// InvalidArgument naming both otherwise (gRPC said only that it could not listen).
absl::Status CheckKeyMatchesCertificate(const std::string& key_path, const std::string& key_pem,
                                        const std::string& cert_path, const std::string& cert_pem);

}  // namespace recall::tls
