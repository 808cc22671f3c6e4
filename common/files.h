// Small files the processes read and write at start: flags' files (keys, tokens,
// certificates) and --port-file.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recall {

// A PEM file's limit (certificate chains, keys, CA bundles).
inline constexpr size_t kMaxPemBytes = 1 << 20;

// The whole of a small regular file named by `flag` (for the errors: "--api-keys"). A path
// that is not a regular file (a directory, a FIFO: never blocks), one that cannot be read or
// one over `max_bytes` is an error naming the flag, the path and the cause.
absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path,
                                          size_t max_bytes);

// ReadSmallFile of a file holding a secret (API keys, the cluster token, a private key),
// with a warning in the log when every user of the machine may read it (as ssh would say).
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path,
                                           size_t max_bytes);

// Writes `line` to `path` whole: through PATH.tmp, renamed over `path`, so that a reader never
// sees a partial file. An error (naming --port-file and the cause) when the file cannot be
// written; PATH.tmp is not left behind.
absl::Status WritePortFile(const std::string& path, const std::string& line);

}  // namespace recall
