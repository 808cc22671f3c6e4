#include "worker/model/file_storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status.h"

namespace recall::model {
namespace {

constexpr size_t kAlignment = 64;

// madvise(MADV_DONTNEED) over the whole pages inside [begin, begin + bytes): a private
// mapping's pages are dropped (read again from the file, or as zeros, if ever touched).
void DropPages(const void* begin, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// A read-only private mapping of a whole file.
class MappedStorage : public Storage {
 public:
  MappedStorage(void* data, size_t size) : data_(data), size_(size) {}
  ~MappedStorage() override { munmap(data_, size_); }
  MappedStorage(const MappedStorage&) = delete;
  MappedStorage& operator=(const MappedStorage&) = delete;

  const void* data() const override { return data_; }
  size_t size() const override { return size_; }
  void Discard(const void* begin, size_t bytes) override { DropPages(begin, bytes); }

 private:
  void* data_;
  size_t size_;
};

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

absl::Status ErrnoStatus(const std::string& path, const char* what, int err) {
  const std::string msg = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Reads the whole file into a heap buffer (for files mmap refuses).
absl::StatusOr<std::unique_ptr<Storage>> ReadToHeap(int fd, const std::string& path, size_t size) {
  absl::StatusOr<std::unique_ptr<HeapStorage>> heap = HeapStorage::Create(size);
  if (!heap.ok()) return heap.status();
  char* out = static_cast<char*>((*heap)->MutableData());
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, out + done, size - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path, "read failed", errno);
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": file shrank while reading (", done, " of ", size, " bytes)"));
    }
    done += static_cast<size_t>(n);
  }
  return std::unique_ptr<Storage>(std::move(*heap));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HeapStorage>> HeapStorage::Create(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  void* data = rounded == 0 ? nullptr : std::aligned_alloc(kAlignment, rounded);
  if (rounded != 0 && data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  if (data != nullptr) std::memset(data, 0, rounded);
  return std::unique_ptr<HeapStorage>(new HeapStorage(data, bytes));
}

HeapStorage::~HeapStorage() { std::free(data_); }

void HeapStorage::Discard(const void* begin, size_t bytes) { DropPages(begin, bytes); }

absl::StatusOr<std::unique_ptr<Storage>> MapFile(const std::string& path) {
  RECALL_RETURN_IF_ERROR(CheckRegularFile(path));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(path, "cannot open", errno);
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(path, "cannot stat", errno);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* data = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data != MAP_FAILED) return std::unique_ptr<Storage>(new MappedStorage(data, size));
  }
  return ReadToHeap(fd, path, size);
}

}  // namespace recall::model
