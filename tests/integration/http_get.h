// A blocking HTTP/1.0 GET against 127.0.0.1 for tests (e.g. a Prometheus /metrics scrape).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace recall::testing {

// The response body, or "" on any failure.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The line of metric `series` (its name and labels, e.g. "recall_x_total") in a /metrics
// scrape of `port`, or "".
inline std::string MetricLine(int port, const std::string& series) {
  const std::string scrape = "\n" + HttpGet(port, "/metrics");
  const size_t at = scrape.find("\n" + series + " ");
  return at == std::string::npos ? "" : scrape.substr(at + 1, scrape.find('\n', at + 1) - at - 1);
}

}  // namespace recall::testing
