// A real redis-server for tests: started on a free port with append-only persistence
// (fsync always) in a temp dir, stopped at the end. Skips the test when redis-server is not
// installed (tools/install_deps.sh installs it).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

namespace recall::testing {

// A port nobody listens on right now.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class RedisServer {
 public:
  static bool Available() { return std::filesystem::exists("/usr/bin/redis-server"); }

  // Starts it and waits until it accepts connections. False on failure. `persistent` false:
  // appendonly no and no save points (a server that keeps nothing on disk).
  // `port` 0: a free one.
  bool Start(const std::string& dir, bool persistent = true, int port = 0) {
    port_ = port != 0 ? port : FreePort();
    pid_ = fork();
    if (pid_ == 0) {
      execl("/usr/bin/redis-server", "redis-server", "--port", std::to_string(port_).c_str(),
            "--bind", "127.0.0.1", "--dir", dir.c_str(), "--appendonly", persistent ? "yes" : "no",
            "--appendfsync", "always", "--save", "", "--daemonize", "no", "--loglevel", "warning",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port_));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      close(fd);
      if (up) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  int port() const { return port_; }
  // SIGKILL (an outage); Start(dir, true, port()) brings it back with what it had persisted.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  ~RedisServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace recall::testing
