#include "common/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/listen_socket.h"

namespace recall::metrics {
namespace {

constexpr int kIoTimeoutMs = 2000;

bool WaitFor(int fd, short events) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, kIoTimeoutMs) == 1 && (p.revents & events) != 0;
}

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    if (!WaitFor(fd, POLLOUT)) return;
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, int port,
                                                              const Registry* registry) {
  absl::StatusOr<int> listening = ListenSocket(host, port);
  if (!listening.ok()) {
    return absl::Status(listening.status().code(),
                        absl::StrCat("metrics: ", listening.status().message()));
  }
  const int fd = *listening;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual = bound.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<HttpServer>(new HttpServer(fd, actual, registry));
}

HttpServer::HttpServer(int fd, int port, const Registry* registry)
    : fd_(fd), port_(port), registry_(registry), thread_([this] { Loop(); }) {}

HttpServer::~HttpServer() {
  stop_ = true;
  thread_.join();
  close(fd_);
}

void HttpServer::Loop() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 100) != 1) continue;
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Serve(conn);
    close(conn);
  }
}

void HttpServer::Serve(int conn) {
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 16384) {
    if (!WaitFor(conn, POLLIN)) return;
    const ssize_t n = recv(conn, buf, sizeof(buf), 0);
    if (n <= 0) break;
    request.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (line.rfind("GET /metrics", 0) == 0) {
    body = registry_->Render();
  } else if (line.rfind("GET /healthz", 0) == 0) {
    body = "ok\n";
  } else {
    status = "404 Not Found";
    body = "not found: try /metrics\n";
  }
  SendAll(conn, absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                             "\r\nContent-Length: ", body.size(),
                             "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace recall::metrics
