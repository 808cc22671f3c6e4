// SalvageSqliteFile: what --allow-store-loss does with a session store whose pages are damaged
// (PRAGMA quick_check). Served in place, such a file failed the writes its open makes (a
// tester's store with five pages overwritten did not start, though it said it would), and a
// damaged index hid rows its table still held (every listing failed). So the rows that can
// still be read are copied into a new file: each table read in its own order, not through an
// index (a table read stops at its first damaged page: the rows past it are lost), the
// damaged file's user_version kept, rows whose parent row was lost (foreign keys) dropped. The
// new file (its owner's only) takes the damaged one's place, which is kept beside it as
// PATH.damaged-UNIXMS (its log too, hard links), for a repair by hand; a stop midway leaves
// either the damaged file as it was or a marker the next start finishes the swap by
// (FinishSalvage). Tables are made as the damaged file's schema says; indexes
// are left to the store's open, which makes them.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace recall::coordinator {

// Returns a line for the log saying what was copied, what was lost and where the damaged file
// is kept. DataLoss when the file's schema cannot be read (nothing is changed then);
// Unavailable when the new file cannot be written (a full disk; nothing changed either).
absl::StatusOr<std::string> SalvageSqliteFile(const std::string& path);

// Finishes a salvage that a stop cut short after its new file was complete (a marker,
// PATH.salvage-done, says so): the new file takes the damaged one's place. Call before the
// store opens `path`. The damaged file's kept name, or "" when there was none to finish. A
// salvage cut short before that leaves PATH.salvage, removed by the next salvage, and the
// damaged file as it was.
absl::StatusOr<std::string> FinishSalvage(const std::string& path);

}  // namespace recall::coordinator
