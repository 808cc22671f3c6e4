// Small files read and written at start: flags' files and --port-file.
#include "common/files.h"

#include <sys/stat.h>

#include <chrono>
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

TEST(WritePortFileTest, WritesTheFileWholeOrSaysWhyNot) {
  const std::string dir = testing::MakeTempDir("port_file");
  ASSERT_TRUE(WritePortFile(dir + "/ports", "grpc=1 http=2\n").ok());
  EXPECT_EQ(testing::ReadFileOrEmpty(dir + "/ports"), "grpc=1 http=2\n");
  EXPECT_FALSE(std::filesystem::exists(dir + "/ports.tmp"));

  const absl::Status missing = WritePortFile(dir + "/no/ports", "x\n");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("--port-file: cannot create " + dir + "/no/ports.tmp"),
            std::string::npos)
      << missing;
  // A directory in its place: refused, and no PATH.tmp left behind.
  std::filesystem::create_directories(dir + "/taken");
  const absl::Status taken = WritePortFile(dir + "/taken", "x\n");
  EXPECT_NE(taken.message().find("--port-file: cannot rename"), std::string::npos) << taken;
  EXPECT_FALSE(std::filesystem::exists(dir + "/taken.tmp"));
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
