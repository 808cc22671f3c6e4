// A minimal HTTP/1.0 server for Prometheus scrapes: GET /metrics returns the registry's
// text; GET /healthz returns "ok"; anything else 404. One thread, one connection at a time
// (scrapes are rare and small), each read and write bounded by a timeout so a stalled
// client cannot hold it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/registry.h"

namespace recall::metrics {

class HttpServer {
 public:
  // Listens on host:port (port 0 picks a free one). Unavailable naming the address when it
  // cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host, int port,
                                                           const Registry* registry);
  ~HttpServer();  // stops the thread and closes the socket
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer(int fd, int port, const Registry* registry);
  void Loop();
  void Serve(int conn);

  const int fd_;
  const int port_;
  const Registry* registry_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace recall::metrics
