#include "common/listen_socket.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/flags.h"

namespace recall {

namespace {

// The listening socket, or -1 with the reason in *reason (a host that does not resolve: its
// resolver's message, with *unresolved set).
int Listen(const std::string& host, int port, std::string* reason, bool* unresolved = nullptr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); rc != 0) {
    *reason = gai_strerror(rc);
    if (unresolved != nullptr) *unresolved = true;
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 16) != 0) {
    *reason = std::strerror(errno);
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace

absl::StatusOr<int> ListenSocket(const std::string& host, int port) {
  std::string reason;
  bool unresolved = false;
  const int fd = Listen(host, port, &reason, &unresolved);
  if (fd >= 0) return fd;
  const std::string where = absl::StrCat(host, ":", port);
  if (unresolved) return absl::InvalidArgumentError(absl::StrCat(where, ": ", reason));
  return absl::UnavailableError(absl::StrCat("cannot listen on ", where, ": ", reason));
}

std::string ReasonCannotListen(const std::string& address) {
  auto host_port = flags::SplitHostPort("listen", address);
  if (!host_port.ok()) return "";
  std::string reason;
  const int fd = Listen(host_port->first, host_port->second, &reason);
  if (fd >= 0) close(fd);
  return reason;
}

}  // namespace recall
