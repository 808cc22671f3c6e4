// Small files read and written at start: flags' files and --port-file.
#include "common/files.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "common/grpc/cluster_credential.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

TEST(ReadSmallFileTest, ReadsARegularFileAndRefusesAnythingElseByName) {
  const std::string dir = testing::MakeTempDir("small_file");
  std::ofstream(dir + "/keys") << "k1 alice\n";
  absl::StatusOr<std::string> ok = ReadSmallFile("--api-keys", dir + "/keys", 100);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "k1 alice\n");

  EXPECT_EQ(ReadSmallFile("--api-keys", dir + "/keys", 4).status().message(),
            "--api-keys: " + dir + "/keys is 9 bytes; at most 4");
  EXPECT_EQ(ReadSmallFile("--api-keys", dir, 100).status().message(),
            "--api-keys: " + dir + " is not a regular file");
  EXPECT_EQ(ReadSmallFile("--api-keys", dir + "/none", 100).status().message(),
            "--api-keys: cannot read " + dir + "/none (No such file or directory)");
  // A FIFO with no writer: refused at once (reading it would wait for ever).
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadSmallFile("--api-keys", dir + "/fifo", 100).status().message(),
            "--api-keys: " + dir + "/fifo is not a regular file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // /dev/zero never ends: refused, not read into memory.
  EXPECT_EQ(ReadSmallFile("--cluster-token-file", "/dev/zero", 100).status().message(),
            "--cluster-token-file: /dev/zero is not a regular file");
}

// What a loader checks before it opens a file: never throws, never waits.
TEST(CheckRegularFileTest, SaysWhatThePathIsWhenNotARegularFile) {
  const std::string dir = testing::MakeTempDir("regular_file");
  std::ofstream(dir + "/file") << "x";
  EXPECT_TRUE(CheckRegularFile(dir + "/file").ok());
  std::filesystem::create_symlink("file", dir + "/link");
  EXPECT_TRUE(CheckRegularFile(dir + "/link").ok()) << "a link to a file is the file";
  EXPECT_EQ(CheckRegularFile(dir + "/none").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckRegularFile(dir + "/none").message(), dir + "/none: no such file or directory");
  EXPECT_EQ(CheckRegularFile(dir).message(), dir + ": is a directory, not a file");
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(CheckRegularFile(dir + "/fifo").message(),
            dir + "/fifo: is not a regular file (a FIFO, socket or device)");
  EXPECT_EQ(CheckRegularFile("/dev/zero").code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::create_symlink("loop", dir + "/loop");
  EXPECT_EQ(CheckRegularFile(dir + "/loop").message(),
            dir + "/loop: cannot read (Too many levels of symbolic links)");
  EXPECT_TRUE(IsDirectory(dir));
  EXPECT_FALSE(IsDirectory(dir + "/file"));
  EXPECT_FALSE(IsDirectory(dir + "/loop"));
}

TEST(WritePortFileTest, WritesTheFileWholeOrSaysWhyNot) {
  const std::string dir = testing::MakeTempDir("port_file");
  ASSERT_TRUE(WritePortFile(dir + "/ports", "grpc=1 http=2\n").ok());
  EXPECT_EQ(testing::ReadFileOrEmpty(dir + "/ports"), "grpc=1 http=2\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1)
      << "nothing beside it";

  const absl::Status missing = WritePortFile(dir + "/no/ports", "x\n");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("--port-file: cannot create " + dir + "/no/ports: "),
            std::string::npos)
      << missing;
  // A directory in its place: refused, and no PATH.tmp left behind.
  std::filesystem::create_directories(dir + "/taken");
  const absl::Status taken = WritePortFile(dir + "/taken", "x\n");
  EXPECT_NE(taken.message().find("--port-file: " + dir + "/taken is a directory"),
            std::string::npos)
      << taken;
  EXPECT_FALSE(std::filesystem::exists(dir + "/taken.tmp"));
}

// A write that fails part way (a full disk; here the file size limit, which fails a write
// the same way) leaves the file as it was and no PATH.tmp; a device is never replaced; the
// check at start refuses what the write would.
TEST(WriteFileWholeTest, AFailedWriteLeavesTheFileAsItWas) {
  const std::string dir = testing::MakeTempDir("write_whole");
  const std::string path = dir + "/cal.json";
  ASSERT_TRUE(WriteFileWhole("--out", path, "old\n").ok());
  const auto handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 16;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status full = WriteFileWhole("--out", path, std::string(100000, 'x'));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, handler);
  EXPECT_EQ(full.code(), absl::StatusCode::kDataLoss) << "not bad usage: the disk";
  EXPECT_NE(full.message().find("--out: cannot write " + path + ": "), std::string::npos) << full;
  EXPECT_NE(full.message().find(path + " is as it was"), std::string::npos) << full;
  EXPECT_EQ(testing::ReadFileOrEmpty(path), "old\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1)
      << "no half-written file left beside it";

  const absl::Status device = WriteFileWhole("--out", "/dev/null", "x");
  EXPECT_NE(device.message().find("--out: /dev/null is not a regular file"), std::string::npos)
      << device;
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  EXPECT_FALSE(std::filesystem::exists("/dev/null.tmp"));

  // A link stays a link, its file written; an existing file keeps its mode.
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::filesystem::create_symlink("cal.json", dir + "/link.json");
  ASSERT_TRUE(WriteFileWhole("--out", dir + "/link.json", "new\n").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/link.json"));
  EXPECT_EQ(testing::ReadFileOrEmpty(path), "new\n");
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_TRUE(CheckOutputFile("--out", path).ok());
  EXPECT_TRUE(CheckOutputFile("--out", dir + "/new.json").ok());
  EXPECT_NE(CheckOutputFile("--out", dir).message().find("is a directory"), std::string::npos);
  EXPECT_NE(
      CheckOutputFile("--out", dir + "/no/x.json").message().find("no directory " + dir + "/no"),
      std::string::npos);
  EXPECT_NE(CheckOutputFile("--out", "/dev/full").message().find("not a regular file"),
            std::string::npos);
  // A link is checked where it leads (a link into a missing directory passed the check).
  std::filesystem::create_symlink(dir + "/gone/x.json", dir + "/far.json");
  EXPECT_NE(
      CheckOutputFile("--out", dir + "/far.json").message().find("no directory " + dir + "/gone"),
      std::string::npos);
}

// A file holding a secret is read whatever its mode; one every user may read comes with a
// warning saying so and what to do.
TEST(ReadSecretFileTest, WarnsWhenEveryUserMayReadIt) {
  const std::string dir = testing::MakeTempDir("secret_file");
  const std::string path = dir + "/keys";
  std::ofstream(path) << "key-a tenant-a\n";
  for (const mode_t mode : {0644, 0640, 0600}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    ::testing::internal::CaptureStderr();
    const absl::StatusOr<std::string> read = ReadSecretFile("--api-keys", path, 100);
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, "key-a tenant-a\n");
    if (mode == 0644) {
      EXPECT_NE(log.find("--api-keys " + path +
                         " holds a secret that every user of this machine "
                         "may read or write (mode 0644): chmod 600 it"),
                std::string::npos)
          << log;
    } else {
      EXPECT_EQ(log, "") << std::oct << mode;
    }
  }
}

// recall serve's token file: one holding a token is kept; an empty one (a write that did
// not finish) or none is made anew; one holding something else is refused, not replaced (the
// workers started with it would stop matching).
TEST(EnsureTokenFileTest, KeepsAGoodTokenMakesAMissingOneAndRefusesABadOne) {
  const std::string dir = testing::MakeTempDir("token_file");
  absl::StatusOr<std::string> made = grpcutil::EnsureTokenFile(dir + "/token");
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->size(), 32u);
  struct stat st;
  ASSERT_EQ(stat((dir + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<std::string> kept = grpcutil::EnsureTokenFile(dir + "/token");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, *made);

  std::ofstream(dir + "/empty");
  absl::StatusOr<std::string> renewed = grpcutil::EnsureTokenFile(dir + "/empty");
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->size(), 32u);

  std::ofstream(dir + "/short") << "short\n";
  absl::StatusOr<std::string> bad = grpcutil::EnsureTokenFile(dir + "/short");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("must be 16 to 4096 bytes, got 5"), std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("delete it for a new one to be made"), std::string::npos)
      << bad.status();
  EXPECT_EQ(testing::ReadFileOrEmpty(dir + "/short"), "short\n") << "not replaced";
}

}  // namespace
}  // namespace recall
