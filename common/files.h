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

// OK when `path` names a regular file (symlinks followed), before a loader opens it;
// otherwise "PATH: ..." saying why: NotFound when it does not exist, InvalidArgument for a
// directory, for a FIFO, socket or device (opening or reading one could block for ever), and
// for what stat(2) refuses (a symlink loop, no permission: the system's words). Never throws.
absl::Status CheckRegularFile(const std::string& path);

// Whether a directory entry named `path` exists, whatever it is or points at (a dangling link
// or a link loop too: a loader then names the problem rather than call it missing).
bool Exists(const std::string& path);

// Whether `path` is a directory (symlinks followed); false for anything stat(2) refuses.
// Never throws (std::filesystem::is_directory without an error_code throws on a loop).
bool IsDirectory(const std::string& path);

// The whole of a small regular file named by `flag` (for the errors: "--api-keys"). A path
// that is not a regular file (a directory, a FIFO: never blocks), one that cannot be read or
// one over `max_bytes` is an error naming the flag, the path and the cause (the path alone
// when `flag` is empty: a file a flag names indirectly, as a model folder's).
absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path,
                                          size_t max_bytes);

// ReadSmallFile of a file holding a secret (API keys, the cluster token, a private key),
// with a warning in the log when every user of the machine may read it (as ssh would say).
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path,
                                           size_t max_bytes);

// Writes `contents` to `path` whole: through a fresh file beside it (.NAME.XXXXXX, made with
// O_EXCL), flushed to disk and renamed over `path` (the directory flushed too), so that a
// reader never sees a partial file and a failed write (a full disk: DATA_LOSS) leaves none,
// nor the fresh file, and `path` as it was. A link is followed (the file it names is
// written); an existing file keeps its mode. An error naming `flag`, the path and the cause.
absl::Status WriteFileWhole(const std::string& flag, const std::string& path,
                            const std::string& contents);

// WriteFileWhole of --port-file.
inline absl::Status WritePortFile(const std::string& path, const std::string& line) {
  return WriteFileWhole("--port-file", path, line);
}

// Whether WriteFileWhole may write `path` once a long run ends, checked at its start: not a
// directory or other non-regular file, in an existing directory this process may write. An
// error naming `flag`, the path and why.
absl::Status CheckOutputFile(const std::string& flag, const std::string& path);

}  // namespace recall
