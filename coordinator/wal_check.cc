#include "coordinator/wal_check.h"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace recall::coordinator {
namespace {

constexpr size_t kHeaderBytes = 32;
constexpr size_t kFrameHeaderBytes = 24;

uint32_t BigEndian(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | static_cast<uint32_t>(p[3]);
}

uint32_t LittleEndian(const unsigned char* p) {
  return static_cast<uint32_t>(p[3]) << 24 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[0]);
}

// SQLite's running checksum over `n` bytes (a multiple of 8), words read in the log's order.
void Checksum(bool big_endian, const unsigned char* p, size_t n, uint32_t* s0, uint32_t* s1) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint32_t x0 = big_endian ? BigEndian(p + i) : LittleEndian(p + i);
    const uint32_t x1 = big_endian ? BigEndian(p + i + 4) : LittleEndian(p + i + 4);
    *s0 += x0 + *s1;
    *s1 += x1 + *s0;
  }
}

// A log SQLite ignores whole.
WalDamage Lost(const std::string& wal_path, const std::string& what) {
  return WalDamage{absl::StrCat("the write-ahead log ", wal_path, " ", what,
                                "; SQLite ignores it, so whatever it held (the sessions and turns "
                                "stored since the last checkpoint) is lost")};
}

}  // namespace

std::optional<WalDamage> DescribeWalDamage(const std::string& wal_path) {
  struct stat st;
  if (::stat(wal_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
    return std::nullopt;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::ifstream in(wal_path, std::ios::binary);
  if (!in) return std::nullopt;  // SQLite will say why it cannot read it
  unsigned char header[kHeaderBytes];
  if (size < kHeaderBytes || !in.read(reinterpret_cast<char*>(header), kHeaderBytes)) {
    return Lost(wal_path, absl::StrCat("is cut short (", size, " bytes, its header is 32)"));
  }
  const uint32_t magic = BigEndian(header);
  const uint32_t page_size = BigEndian(header + 8);
  const bool big_endian = magic == 0x377f0683;
  uint32_t s0 = 0, s1 = 0;
  Checksum(big_endian, header, 24, &s0, &s1);
  if ((magic != 0x377f0682 && magic != 0x377f0683) || page_size < 512 || page_size > 65536 ||
      (page_size & (page_size - 1)) != 0 || s0 != BigEndian(header + 24) ||
      s1 != BigEndian(header + 28)) {
    return Lost(wal_path, absl::StrCat("has no valid header (", size, " bytes)"));
  }
  const uint32_t salt1 = BigEndian(header + 16), salt2 = BigEndian(header + 20);
  std::vector<unsigned char> frame(kFrameHeaderBytes + page_size);
  uint64_t offset = kHeaderBytes;
  // SQLite keeps the frames up to the first that fails its checksum or has other salts (the
  // log's end: what follows is an earlier generation's, stale). A frame with this log's
  // salts further on shows the first bad one was damaged, not the end.
  int64_t bad_at = -1;        // the first frame SQLite drops
  bool salts_bad = false;     // ... because of its salts (the end, unless this log goes on)
  uint64_t ours_end = 0;      // the end of the last frame with this log's salts
  int64_t commits_after = 0;  // commit frames of this log's from bad_at on
  while (
      in.read(reinterpret_cast<char*>(frame.data()), static_cast<std::streamsize>(frame.size()))) {
    const unsigned char* f = frame.data();
    const bool ours = BigEndian(f + 8) == salt1 && BigEndian(f + 12) == salt2;
    if (!ours) {
      if (bad_at < 0) {
        bad_at = static_cast<int64_t>(offset);
        salts_bad = true;
      }
    } else if (bad_at >= 0) {
      salts_bad = false;  // this log goes on: the frame at bad_at was damaged
      if (BigEndian(f + 4) != 0) ++commits_after;
    } else {
      uint32_t c0 = s0, c1 = s1;
      Checksum(big_endian, f, 8, &c0, &c1);
      Checksum(big_endian, f + kFrameHeaderBytes, page_size, &c0, &c1);
      if (c0 == BigEndian(f + 16) && c1 == BigEndian(f + 20)) {
        s0 = c0;
        s1 = c1;
      } else {
        bad_at = static_cast<int64_t>(offset);
        if (BigEndian(f + 4) != 0) ++commits_after;
      }
    }
    offset += frame.size();
    if (ours) ours_end = offset;
  }
  // Other salts with none of this log's after them: the end, not damage. A frame that fails
  // its checksum with no commit at or after it: the tail of a transaction a crash cut short,
  // never acknowledged.
  if (bad_at < 0 || salts_bad || commits_after == 0) return std::nullopt;
  const uint64_t lost = ours_end - static_cast<uint64_t>(bad_at);
  return WalDamage{
      absl::StrCat("the write-ahead log ", wal_path, " has a damaged frame at byte ", bad_at,
                   ": SQLite drops it and the ", lost / frame.size() - 1, " frame(s) after it (",
                   lost, " bytes, ", commits_after,
                   " committed transaction(s); the last may be one a crash cut short, never "
                   "acknowledged), so the sessions and turns they stored are lost"),
      commits_after == 1};
}

}  // namespace recall::coordinator
