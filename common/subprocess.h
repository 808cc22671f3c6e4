// ServerProcess: runs a server binary as a child process (recall serve, integration tests,
// benchmarks): starts it with --port-file, waits until the file appears, and stops it
// (SIGTERM, then SIGKILL) at the end.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace recall {

// A wait status in words: "exited with status 2", "was killed by signal 9 (Killed)".
inline std::string ExitReason(int wait_status) {
  if (WIFEXITED(wait_status))
    return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(wait_status)) + " (" +
           strsignal(WTERMSIG(wait_status)) + ")";
  }
  return "ended (wait status " + std::to_string(wait_status) + ")";
}

class ServerProcess {
 public:
  // Starts `binary args... --port-file <tmp>`; ports() is filled once it listens.
  // Returns false (with *error) if it exits or does not listen within `timeout`, or when
  // `give_up` (asked while it starts) says so: then it is stopped.
  bool Start(const std::string& binary, std::vector<std::string> args, const std::string& tmp_dir,
             std::string* error, std::chrono::seconds timeout = std::chrono::seconds(60),
             const std::function<bool()>& give_up = nullptr) {
    port_file_ = tmp_dir + "/ports." + std::to_string(getpid()) + "." + std::to_string(counter_++);
    ports_.clear();
    early_exit_.reset();
    std::filesystem::remove(port_file_);
    args.insert(args.begin(), binary);
    args.push_back("--port-file");
    args.push_back(port_file_);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (die_with_parent_) {
      // fork and exec, the child asking the kernel for SIGTERM when this thread's process
      // ends however it ends (SIGKILL included); only async-signal-safe calls in between.
      const pid_t parent = getpid();
      pid_ = fork();
      if (pid_ == 0) {
        // The parent may block signals it waits for (recall serve: SIGINT, SIGTERM,
        // SIGCHLD); the child starts with none blocked, so SIGTERM ends it at once.
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);  // the parent died before the line above
        // Only stdin, stdout and stderr go to the child: not the parent's sockets (recall
        // serve's clients' connections, which a child holding them would keep open).
        close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
        execve(binary.c_str(), argv.data(), environ);
        _exit(127);
      }
      if (pid_ < 0) {
        *error = "cannot fork for " + binary;
        pid_ = -1;
        return false;
      }
    } else if (posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
      *error = "cannot spawn " + binary;
      pid_ = -1;
      return false;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      // (Asked first: a Ctrl-C reaches the child too, whose end would otherwise read as a
      // failure.)
      if (give_up != nullptr && give_up()) {
        *error = binary + " was stopped before it listened";
        Stop();
        return false;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        *error = binary + " " + ExitReason(status) + " before listening";
        early_exit_ = status;
        pid_ = -1;
        return false;
      }
      std::ifstream in(port_file_);
      std::string word;
      while (in >> word) {
        const size_t eq = word.find('=');
        if (eq != std::string::npos) ports_[word.substr(0, eq)] = std::stoi(word.substr(eq + 1));
      }
      if (!ports_.empty()) {
        std::error_code ignored;  // read: not left in tmp_dir (a data dir, for recall serve)
        std::filesystem::remove(port_file_, ignored);
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    *error = binary + " did not listen within the timeout";
    Stop();
    return false;
  }

  pid_t pid() const { return pid_; }
  // The children started from now on are sent SIGTERM when this process ends, even by
  // SIGKILL (Linux's PR_SET_PDEATHSIG), so none is left holding its memory. The thread that
  // calls Start must live as long as the children (the signal comes when it exits).
  void set_die_with_parent(bool on) { die_with_parent_ = on; }
  // The wait status of a Start that failed because the process ended first.
  std::optional<int> early_exit() const { return early_exit_; }

  int port(const std::string& name) const {
    auto it = ports_.find(name);
    return it == ports_.end() ? 0 : it->second;
  }

  // SIGTERM; a second one after 2 s (a worker or coordinator then ends the turns it lets
  // run after the first: --shutdown-grace); SIGKILL after 10 s. Returns the exit status (or
  // -1).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = -1;
    for (int i = 0; i < 1000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      if (i == 200) kill(pid_, SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  // If it has exited: reaps it and returns its wait status (then pid() is -1); else nullopt.
  std::optional<int> Reap() {
    if (pid_ <= 0) return std::nullopt;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return status;
  }

  // Kills it at once (failure injection).
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  ~ServerProcess() { Stop(); }

 private:
  static inline int counter_ = 0;
  pid_t pid_ = -1;
  std::string port_file_;
  std::map<std::string, int> ports_;
  std::optional<int> early_exit_;
  bool die_with_parent_ = false;
};

}  // namespace recall
