#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall {

namespace {

// The file `path` names: symbolic links followed (a dangling one: the file it would name).
std::string LinkTarget(std::string path) {
  for (int hop = 0; hop < 16; ++hop) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    char target[4096];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
    if (n <= 0) return path;
    const std::string to(target, static_cast<size_t>(n));
    const size_t slash = path.rfind('/');
    path = to[0] == '/' || slash == std::string::npos ? to : path.substr(0, slash + 1) + to;
  }
  return path;
}

// The directory `path` is in ("." for a bare name).
std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// OK when nothing is at `path` or a regular file is (symlinks followed).
absl::Status NotAnotherKindOfFile(const std::string& flag, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", path, " is ", S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
        "; name a file to write"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path,
                                     size_t max_bytes, mode_t* mode) {
  // With no flag the messages name the file only ("PATH: cannot read (...)").
  const std::string who = flag.empty() ? path : absl::StrCat(flag, ": ", path);
  const auto cannot_read = [&] {
    const std::string cause = std::strerror(errno);
    return absl::InvalidArgumentError(
        flag.empty() ? absl::StrCat(path, ": cannot read (", cause, ")")
                     : absl::StrCat(flag, ": cannot read ", path, " (", cause, ")"));
  };
  // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return cannot_read();
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return cannot_read();
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(who, " is not a regular file"));
  }
  const auto too_large = [&](uint64_t size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " is ", size, " bytes; at most ", max_bytes));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_large(st.st_size);
  if (mode != nullptr) *mode = st.st_mode;
  std::string out;
  char buf[8192];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return cannot_read();
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) return too_large(out.size());  // it grew while read
  }
  return out;
}

}  // namespace

absl::Status CheckRegularFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read (", std::strerror(errno), ")"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is not a regular file (a FIFO, socket or device)"));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& flag, const std::string& path,
                                          size_t max_bytes) {
  return ReadFile(flag, path, max_bytes, nullptr);
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& flag, const std::string& path,
                                           size_t max_bytes) {
  mode_t mode = 0;
  absl::StatusOr<std::string> out = ReadFile(flag, path, max_bytes, &mode);
  if (out.ok() && (mode & (S_IROTH | S_IWOTH)) != 0) {
    RECALL_LOG(WARNING) << flag << " " << path
                        << " holds a secret that every user of this machine may read or write "
                           "(mode "
                        << absl::StrFormat("%04o", mode & 07777) << "): chmod 600 it";
  }
  return out;
}

absl::Status WriteFileWhole(const std::string& flag, const std::string& link,
                            const std::string& contents) {
  // Never renamed over a directory or a device (as root, --out /dev/null would have replaced
  // the device with a file).
  RECALL_RETURN_IF_ERROR(NotAnotherKindOfFile(flag, link));
  const std::string path = LinkTarget(link);  // a link stays, and its file is written
  const std::string dir = DirectoryOf(path);
  // A fresh name of its own (O_EXCL: never a link someone left there, never another writer's).
  std::string tmp = dir + "/." + path.substr(path.rfind('/') + 1) + ".XXXXXX";
  if (path.find('/') == std::string::npos) tmp = "." + path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    const std::string cause = std::strerror(errno);
    const absl::StatusCode code = errno == ENOSPC || errno == EDQUOT
                                      ? absl::StatusCode::kDataLoss
                                      : absl::StatusCode::kInvalidArgument;
    return absl::Status(code, absl::StrCat(flag, ": cannot create ", path, ": ", cause));
  }
  struct stat old;
  const bool existed = ::stat(path.c_str(), &old) == 0;
  // Its mode, or what a new file gets (mkstemp makes 0600); best effort (some file systems
  // refuse chmod).
  const mode_t umask_now = ::umask(0);
  ::umask(umask_now);
  (void)::fchmod(fd, existed ? (old.st_mode & 07777) : (0666 & ~umask_now));
  int error = 0;
  for (size_t done = 0; done < contents.size() && error == 0;) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      error = errno;
    }
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) error = errno;
  if (error == 0) {
    // The rename itself made durable: the directory's entry.
    if (const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
      (void)::fsync(d);
      ::close(d);
    }
    return absl::OkStatus();
  }
  std::remove(tmp.c_str());
  // Not the flag's value (exit 2 is bad usage) but the disk: a full one, most likely.
  return absl::DataLossError(absl::StrCat(flag, ": cannot write ", path, ": ", std::strerror(error),
                                          "; ", path, existed ? " is as it was" : " is not there"));
}

absl::Status CheckOutputFile(const std::string& flag, const std::string& link) {
  RECALL_RETURN_IF_ERROR(NotAnotherKindOfFile(flag, link));
  const std::string path = LinkTarget(link);  // where WriteFileWhole writes
  const std::string dir = DirectoryOf(path);
  if (!IsDirectory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot write ", path, ": no directory ", dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot write ", path, " in ", dir, " (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

}  // namespace recall
