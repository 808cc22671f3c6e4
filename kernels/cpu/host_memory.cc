// HostMemory: the Memory of the CPU backend (kernels/memory.h).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/memory.h"

namespace recall::kernels {
namespace {

class HostMemoryImpl : public Memory {
 public:
  const char* Name() const override { return "host"; }
  bool host_accessible() const override { return true; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0);
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* p) override { std::free(p); }
  void Discard(void* p, size_t bytes) override {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
    // Only whole pages inside the range: the allocator's own words lie outside it.
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
  void CopyIn(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void CopyOut(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void CopyOutRows(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                   size_t row_bytes, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dst_stride,
                   static_cast<const char*>(src) + r * src_stride, row_bytes);
    }
  }
  void CompactRows(const PagedKvHead& rows, const int32_t* keep, int n) override {
    const size_t row_bytes = static_cast<size_t>(rows.row_bytes());
    const bool scaled = rows.dtype == KvDType::kInt8;
    for (int i = 0; i < n; ++i) {
      if (keep[i] == i) continue;
      for (int is_v = 0; is_v < 2; ++is_v) {
        std::memcpy(rows.RowData(is_v, i), rows.RowData(is_v, keep[i]), row_bytes);
        if (scaled) *rows.RowScale(is_v, i) = *rows.RowScale(is_v, keep[i]);
      }
    }
  }
};

class OpaqueHostMemoryImpl final : public HostMemoryImpl {
 public:
  const char* Name() const override { return "host (opaque)"; }
  bool host_accessible() const override { return false; }
};

}  // namespace

Memory& HostMemory() {
  static HostMemoryImpl* memory = new HostMemoryImpl();
  return *memory;
}

Memory& OpaqueHostMemory() {
  static OpaqueHostMemoryImpl* memory = new OpaqueHostMemoryImpl();
  return *memory;
}

}  // namespace recall::kernels
