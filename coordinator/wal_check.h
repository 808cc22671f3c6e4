// The session store's write-ahead log (SQLite's PATH-wal), read before SQLite opens it. SQLite
// replays the log's frames up to the first one whose checksum fails and drops the rest,
// silently: a damaged log (a flipped byte, a copy cut short, garbage over it) lost the
// sessions and turns it held, and the coordinator started as if nothing had happened. This
// says what a damaged log held that SQLite will drop, so the coordinator can say so.
//
// The log's format is SQLite's (https://www.sqlite.org/fileformat2.html#walformat): a 32-byte
// header (magic, version, page size, checkpoint count, two salts, a checksum), then frames of
// a 24-byte header (page number, the database's size in pages for the frame that commits a
// transaction, the salts, a running checksum) and a page. Frames of an earlier generation of
// the log (other salts) are stale, not damage; nor is a last transaction cut short by a
// crash (no commit frame follows).
//
// Thread safety: a pure function of the file.
#pragma once

#include <optional>
#include <string>

namespace recall::coordinator {

// What SQLite will drop from a damaged log.
struct WalDamage {
  std::string what;  // the offset, the frames and committed transactions lost, in bytes
  // The damage is in the log's last transaction, with no other after it: what a power cut
  // leaves when the commit frame reached the disk and an earlier frame of it did not (so it
  // was never acknowledged), or a later fault in the last turn written.
  bool last_transaction_only = false;
};

// What SQLite will drop from the log at `wal_path` because it is damaged, or nullopt when the
// log is absent, empty or whole (stale frames and an uncommitted tail are not damage).
std::optional<WalDamage> DescribeWalDamage(const std::string& wal_path);

}  // namespace recall::coordinator
