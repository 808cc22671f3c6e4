// A `recall serve`-like pair of child processes on stories260K for the integration tests:
// one worker (16 MiB KV pool, one thread) and a coordinator routing to it.
#pragma once

#include <string>
#include <vector>

#include "common/subprocess.h"
#include "tests/common/test_util.h"

namespace recall::testing {

// A slow model for the worker (random weights of SmolLM2's shape, tens of ms a token), whose
// turns are still running when a test acts on them.
inline std::vector<std::string> SlowModelFlags() {
  return {"--model", SharedPath("tokenizers/smollm2"), "--random-weights", "--kv-cache-bytes",
          "256M"};
}

// Starts both in `dir` (the worker on `model`'s flags: stories260K and a 16 MiB pool unless
// given); returns the coordinator's "127.0.0.1:PORT", or "" with *error set.
inline std::string StartServe(const std::string& dir, ServerProcess& worker,
                              ServerProcess& coordinator, std::string* error,
                              std::vector<std::string> model = {}) {
  if (model.empty()) {
    model = {"--model",          SharedPath("models/stories260K/stories260K.bin"),
             "--tokenizer",      SharedPath("models/stories260K/tok512.bin"),
             "--kv-cache-bytes", "16M"};
  }
  for (const char* f : {"--listen", "127.0.0.1:0", "--threads", "1"}) model.push_back(f);
  if (!worker.Start(RECALL_WORKER_BINARY, model, dir, error)) return "";
  if (!coordinator.Start(RECALL_COORDINATOR_BINARY,
                         {"--workers", "127.0.0.1:" + std::to_string(worker.port("grpc")),
                          "--listen", "127.0.0.1:0", "--data-dir", dir},
                         dir, error)) {
    return "";
  }
  return "127.0.0.1:" + std::to_string(coordinator.port("grpc"));
}

}  // namespace recall::testing
