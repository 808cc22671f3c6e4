// Helpers shared by the test suites.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace recall::testing {

// The shared/ data folder: $RECALL_SHARED_DIR, else the folder beside the source tree.
inline std::string SharedDir() {
  if (const char* env = std::getenv("RECALL_SHARED_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return RECALL_SHARED_DIR_DEFAULT;
}

inline std::string SharedPath(const std::string& relative) { return SharedDir() + "/" + relative; }

// A file of the source tree: under $RECALL_SOURCE_DIR (a checkout moved elsewhere, as on the
// GPU machine, where bench/gpu/device_run.sh sets it), else the tree the test was built from.
inline std::string SourcePath(const std::string& relative) {
  if (const char* env = std::getenv("RECALL_SOURCE_DIR"); env != nullptr && *env != '\0') {
    return std::string(env) + "/" + relative;
  }
  return std::string(RECALL_SOURCE_DIR) + "/" + relative;
}

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Overwrites `n` bytes of the file at `path` from byte `at` with `with` (a disk fault).
inline void OverwriteBytes(const std::string& path, int64_t at, size_t n, char with) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  const std::string junk(n, with);
  f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
}

// A fresh empty directory under the test temp dir, removed by the caller if it wants.
inline std::string MakeTempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "recall_" + name + "_" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs a shell command to its exit, killed after `seconds` (a process that should have
// stopped at once but serves: status 124 from timeout(1)): its exit status (-1 when it did not
// exit normally) and what it printed on stdout and stderr.
struct Exit {
  int code = -1;
  std::string output;
};
inline Exit RunToExit(const std::string& command, int seconds = 120) {
  Exit e;
  std::string quoted;  // the command as one single-quoted shell word
  for (const char c : command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string timed =
      "timeout -k 5 " + std::to_string(seconds) + " sh -c '" + quoted + "' 2>&1";
  FILE* p = popen(timed.c_str(), "r");
  if (p == nullptr) {
    e.output = "popen failed";
    return e;
  }
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) e.output.append(buf, n);
  const int status = pclose(p);
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  return e;
}

}  // namespace recall::testing

// Skips the current test (with a message naming the file) when shared data is missing.
#define RECALL_REQUIRE_SHARED_FILE(relative)                                              \
  do {                                                                                    \
    const std::string recall_shared_path_ = ::recall::testing::SharedPath(relative);      \
    if (!std::filesystem::exists(recall_shared_path_)) {                                  \
      GTEST_SKIP() << "shared data missing: " << recall_shared_path_                      \
                   << " (set RECALL_SHARED_DIR to the shared/ folder)";                   \
    }                                                                                     \
  } while (0)
