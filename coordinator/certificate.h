// A server certificate's dates, checked at start: a coordinator started with a certificate
// that has expired (or is not valid yet) would serve TLS that every client refuses, each
// with a handshake error of its own; it is refused at start instead, naming the flag.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace recall::coordinator {

// OK when every certificate of `pem` (the file at `path`, given by `flag`: the server's, then
// its chain) is valid now; FailedPrecondition naming the flag, the file, the certificate and
// the date when one has expired or is not valid yet; InvalidArgument when it holds no
// certificate OpenSSL reads.
absl::Status CheckCertificateDates(const std::string& flag, const std::string& path,
                                   const std::string& pem);

}  // namespace recall::coordinator
