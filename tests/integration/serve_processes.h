// A `recall serve`-like pair of child processes on stories260K for the integration tests:
// one worker (16 MiB KV pool, one thread) and a coordinator routing to it.
#pragma once

#include <string>

#include "common/subprocess.h"
#include "tests/common/test_util.h"

namespace recall::testing {

// Starts both in `dir`; returns the coordinator's "127.0.0.1:PORT", or "" with *error set.
inline std::string StartServe(const std::string& dir, ServerProcess& worker,
                              ServerProcess& coordinator, std::string* error) {
  if (!worker.Start(RECALL_WORKER_BINARY,
                    {"--model", SharedPath("models/stories260K/stories260K.bin"), "--tokenizer",
                     SharedPath("models/stories260K/tok512.bin"), "--listen", "127.0.0.1:0",
                     "--kv-cache-bytes", "16M", "--threads", "1"},
                    dir, error)) {
    return "";
  }
  if (!coordinator.Start(RECALL_COORDINATOR_BINARY,
                         {"--workers", "127.0.0.1:" + std::to_string(worker.port("grpc")),
                          "--listen", "127.0.0.1:0", "--data-dir", dir},
                         dir, error)) {
    return "";
  }
  return "127.0.0.1:" + std::to_string(coordinator.port("grpc"));
}

}  // namespace recall::testing
