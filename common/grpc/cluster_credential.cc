#include "common/grpc/cluster_credential.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace recall::grpcutil {
namespace {

constexpr char kBearer[] = "Bearer ";

// Compares in time independent of where the strings differ.
bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) diff |= static_cast<unsigned char>(a[i % a.size()] ^ b[i]);
  return diff == 0 && !a.empty();
}

}  // namespace

absl::StatusOr<ClusterCredential> ClusterCredential::FromToken(const std::string& token,
                                                               const std::string& source) {
  const std::string t(absl::StripAsciiWhitespace(token));
  if (t.size() < 16 || t.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the cluster token must be 16 to 4096 bytes, got ", t.size()));
  }
  for (char c : t) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the cluster token must be printable ASCII without spaces"));
    }
  }
  ClusterCredential out;
  out.token_ = t;
  return out;
}

absl::StatusOr<ClusterCredential> ClusterCredential::Load(const std::string& path) {
  RECALL_ASSIGN_OR_RETURN(const std::string token,
                          ReadSecretFile("--cluster-token-file", path, kMaxTokenFileBytes));
  return FromToken(token, absl::StrCat("--cluster-token-file ", path));
}

grpc::Status ClusterCredential::Check(const grpc::ServerContextBase& context,
                                      const char* what) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("authorization: missing; ", what,
                                     " accepts only the cluster token (--cluster-token-file)"));
  }
  const std::string value(it->second.data(), it->second.size());
  // The scheme's name is case-insensitive (RFC 9110 11.1), as for API keys.
  const std::string presented = absl::StartsWithIgnoreCase(value, kBearer)
                                    ? value.substr(sizeof(kBearer) - 1)
                                    : std::string();
  if (!SameSecret(token_, presented)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(what,
                                     " accepts only the cluster token, and the one "
                                     "presented is not it (an API key, or another "
                                     "cluster's token: give the coordinator's "
                                     "--cluster-token-file)"));
  }
  return grpc::Status::OK;
}

void ClusterCredential::Attach(grpc::ClientContext* context) const {
  if (enabled()) context->AddMetadata("authorization", kBearer + token_);
}

absl::StatusOr<std::string> EnsureTokenFile(const std::string& path) {
  // One there is kept, or refused when it is not a token (the workers started with it
  // would no longer match a new one); an empty one (a write that did not finish) or none is
  // made anew.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !(S_ISREG(st.st_mode) && st.st_size == 0)) {
    absl::StatusOr<ClusterCredential> existing = ClusterCredential::Load(path);
    if (!existing.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          existing.status().message(), "; mend it, or delete it for a new one to be made"));
    }
    return existing->token();
  }
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&token, absl::Hex(rd(), absl::kZeroPad8));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, " (", std::strerror(errno), ")"));
  }
  const std::string line = token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::fchmod(fd, 0600);
  ::close(fd);
  if (!ok) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return token;
}

}  // namespace recall::grpcutil
