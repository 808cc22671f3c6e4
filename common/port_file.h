// --port-file: the ports a process listens on, written once it serves, for scripts and tests
// that start it on port 0.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace recall {

// Writes `line` to `path` whole: through PATH.tmp, renamed over `path`, so that a reader never
// sees a partial file. An error (naming --port-file and the cause) when the file cannot be
// written; PATH.tmp is not left behind.
absl::Status WritePortFile(const std::string& path, const std::string& line);

}  // namespace recall
