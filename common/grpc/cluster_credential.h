// The cluster credential: what the coordinator and the workers present to each other, kept
// apart from tenants' API keys. A worker's port (recall.v1.Worker) and the coordinator's
// recall.v1.Registry accept only the cluster token, sent as "authorization: Bearer <token>":
// no authorization is UNAUTHENTICATED, any other bearer (a tenant's API key among them) is
// PERMISSION_DENIED. The token is read from a file (--cluster-token-file), never from argv.
// Without one the ports are open, as for local use, and the process says so at start.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace recall::grpcutil {

class ClusterCredential {
 public:
  // Open: every caller is accepted, and nothing is sent.
  static ClusterCredential Open() { return ClusterCredential(); }
  // The token is the file's content without surrounding whitespace: at least 16 bytes of
  // printable ASCII without spaces, from a regular file of at most kMaxTokenFileBytes.
  // InvalidArgument naming the flag and the file otherwise.
  static absl::StatusOr<ClusterCredential> Load(const std::string& path);
  static constexpr size_t kMaxTokenFileBytes = 64 << 10;
  // For tests and for `recall serve`, which makes one: `token` as above.
  static absl::StatusOr<ClusterCredential> FromToken(const std::string& token,
                                                     const std::string& source);

  bool enabled() const { return !token_.empty(); }
  // OK for the cluster token (or when open); UNAUTHENTICATED without authorization;
  // PERMISSION_DENIED for another bearer. `what` names the port in the message.
  grpc::Status Check(const grpc::ServerContextBase& context, const char* what) const;
  // Adds the token to an outgoing call (nothing when open).
  void Attach(grpc::ClientContext* context) const;
  const std::string& token() const { return token_; }

 private:
  std::string token_;
};

// A fresh random token (32 hex digits from /dev/urandom) written to `path` with mode 0600,
// unless the file is there: one that holds a token is kept, one that does not is an error
// (the workers started with it would not match a new token); an empty one is written anew.
// Returns the token.
absl::StatusOr<std::string> EnsureTokenFile(const std::string& path);

}  // namespace recall::grpcutil
