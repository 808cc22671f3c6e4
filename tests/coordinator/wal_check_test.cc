// The session store's write-ahead log checked before SQLite opens it (coordinator/wal_check.h),
// on logs a real store wrote: a whole log passes; a flipped byte mid-log, a garbage header
// and a log cut inside its header are described; the store opened from the damaged copy has
// lost what the description says (SQLite dropped it without a word).
#include "coordinator/wal_check.h"

#include <filesystem>
#include <fstream>

#include "coordinator/session_store.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/coordinator/store_sessions.h"

namespace recall::coordinator {
namespace {

namespace fs = std::filesystem;

// A copy of the store `from` (sessions.db and its -wal, taken while it is open) in `to`.
void CopyStore(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  fs::copy_file(from + "/sessions.db", to + "/sessions.db", fs::copy_options::overwrite_existing);
  fs::copy_file(from + "/sessions.db-wal", to + "/sessions.db-wal",
                fs::copy_options::overwrite_existing);
}

void Overwrite(const std::string& path, uint64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The page size a log's header names (big-endian, at byte 8).
uint64_t PageSize(const std::string& wal) {
  unsigned char b[12] = {};
  std::ifstream(wal, std::ios::binary).read(reinterpret_cast<char*>(b), sizeof(b));
  return uint64_t{b[8]} << 24 | uint64_t{b[9]} << 16 | uint64_t{b[10]} << 8 | b[11];
}

// The sessions a copy serves, past its damage (allow_loss; refused otherwise).
int Sessions(const std::string& dir) {
  auto store = OpenSqliteStore(dir + "/sessions.db", /*allow_loss=*/true);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return -1;
  auto n = (*store)->CountSessions("a");
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : -1;
}

TEST(WalCheckTest, ADamagedLogIsDescribedAndAWholeOneIsNot) {
  const std::string dir = testing::MakeTempDir("wal_check");
  fs::create_directories(dir + "/live");
  auto store = OpenSqliteStore(dir + "/live/sessions.db");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_NO_FATAL_FAILURE(AddTestSessions(**store, /*message_bytes=*/3000));
  // Taken while the store is open: its last transactions are in the log only.
  for (const char* copy : {"whole", "flipped", "salt", "header", "cut", "last"}) {
    CopyStore(dir + "/live", dir + "/" + copy);
  }
  const uint64_t size = fs::file_size(dir + "/whole/sessions.db-wal");
  ASSERT_GT(size, 32u * 1024) << "the log holds the sessions";

  EXPECT_EQ(DescribeWalDamage(dir + "/whole/sessions.db-wal"), std::nullopt);
  EXPECT_EQ(DescribeWalDamage(dir + "/none/sessions.db-wal"), std::nullopt) << "no log";
  EXPECT_EQ(Sessions(dir + "/whole"), 40);

  // Bytes flipped mid-log, inside the page of the middle frame (not its salts, which would
  // read as the log's end): SQLite keeps the frames before it only.
  const std::string flipped = dir + "/flipped/sessions.db-wal";
  const uint64_t frame = 24 + PageSize(flipped);
  const uint64_t frames = (size - 32) / frame;
  Overwrite(flipped, 32 + frames / 2 * frame + 24 + 100, "\xde\xad\xbe\xef");
  const std::optional<WalDamage> said = DescribeWalDamage(flipped);
  ASSERT_TRUE(said.has_value());
  EXPECT_NE(said->what.find(flipped + " has a damaged frame at byte "), std::string::npos)
      << said->what;
  EXPECT_NE(said->what.find("committed transaction(s)"), std::string::npos) << said->what;
  EXPECT_FALSE(said->last_transaction_only) << said->what;
  // Refused by default, before SQLite replays (and drops) the log: the log is left whole.
  const uint64_t before = fs::file_size(flipped);
  auto refused = OpenSqliteStore(dir + "/flipped/sessions.db");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_NE(refused.status().message().find("has a damaged frame at byte "), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--allow-store-loss"), std::string::npos)
      << refused.status();
  EXPECT_EQ(fs::file_size(flipped), before) << "the log left as it was";
  EXPECT_LT(Sessions(dir + "/flipped"), 40) << "what the description says was lost is";

  // A frame's salts damaged: the log does not end there, as this log's frames follow.
  Overwrite(dir + "/salt/sessions.db-wal", 32 + frames / 2 * frame + 8, "\xde\xad\xbe\xef");
  const std::optional<WalDamage> salt = DescribeWalDamage(dir + "/salt/sessions.db-wal");
  ASSERT_TRUE(salt.has_value());
  EXPECT_NE(
      salt->what.find("has a damaged frame at byte " + std::to_string(32 + frames / 2 * frame)),
      std::string::npos)
      << salt->what;
  EXPECT_LT(Sessions(dir + "/salt"), 40);

  Overwrite(dir + "/header/sessions.db-wal", 0, std::string(32, 'z'));
  const std::optional<WalDamage> header = DescribeWalDamage(dir + "/header/sessions.db-wal");
  ASSERT_TRUE(header.has_value());
  EXPECT_NE(header->what.find("has no valid header (" + std::to_string(size) + " bytes)"),
            std::string::npos)
      << header->what;

  // The last frame's page damaged (the last transaction's commit frame, as a power cut in its
  // commit can leave it): said, but a store opens on it (a crash must not stop the start),
  // without the last transaction.
  const std::string last = dir + "/last/sessions.db-wal";
  Overwrite(last, 32 + (frames - 1) * frame + 24 + 100, "\xde\xad\xbe\xef");
  const std::optional<WalDamage> torn = DescribeWalDamage(last);
  ASSERT_TRUE(torn.has_value());
  EXPECT_TRUE(torn->last_transaction_only) << torn->what;
  {
    auto store = OpenSqliteStore(dir + "/last/sessions.db");
    ASSERT_TRUE(store.ok()) << store.status();
  }

  // Cut at a frame's end: what remains is whole (an uncommitted tail, as a crash leaves one),
  // so nothing is said; what was past the cut is lost without a trace (usage.md says so).
  fs::resize_file(dir + "/cut/sessions.db-wal", 32 + frames / 2 * frame);
  EXPECT_EQ(DescribeWalDamage(dir + "/cut/sessions.db-wal"), std::nullopt);
  fs::resize_file(dir + "/cut/sessions.db-wal", 20);
  const std::optional<WalDamage> cut = DescribeWalDamage(dir + "/cut/sessions.db-wal");
  ASSERT_TRUE(cut.has_value());
  EXPECT_NE(cut->what.find("is cut short (20 bytes, its header is 32)"), std::string::npos)
      << cut->what;
}

}  // namespace
}  // namespace recall::coordinator
