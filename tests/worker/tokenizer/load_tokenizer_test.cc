// LoadTokenizer: dispatch by file name and directory contents.
#include <filesystem>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {
namespace {

using ::recall::testing::SharedPath;

TEST(LoadTokenizerTest, DispatchesOnTheFileName) {
  RECALL_REQUIRE_SHARED_FILE("tokenizers/llama2-32k/tokenizer.model");
  RECALL_REQUIRE_SHARED_FILE("tokenizers/smollm2/tokenizer.json");
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/tok512.bin");
  auto sp = LoadTokenizer(SharedPath("tokenizers/llama2-32k/tokenizer.model"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ((*sp)->vocab_size(), 32000);
  auto hf = LoadTokenizer(SharedPath("tokenizers/smollm2/tokenizer.json"));
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->vocab_size(), 49152);
  auto bin = LoadTokenizer(SharedPath("models/stories260K/tok512.bin"), 512);
  ASSERT_TRUE(bin.ok()) << bin.status();
  EXPECT_EQ((*bin)->vocab_size(), 512);
}

TEST(LoadTokenizerTest, ADirectoryPrefersTokenizerJsonThenTokenizerModel) {
  RECALL_REQUIRE_SHARED_FILE("tokenizers/smollm2/tokenizer.json");
  RECALL_REQUIRE_SHARED_FILE("tokenizers/llama2-32k/tokenizer.model");
  auto hf = LoadTokenizer(SharedPath("tokenizers/smollm2"));
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->vocab_size(), 49152);
  auto sp = LoadTokenizer(SharedPath("tokenizers/llama2-32k"));
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ((*sp)->vocab_size(), 32000);
}

TEST(LoadTokenizerTest, MissingPathsAreNotFoundNamingThePath) {
  const std::string dir = ::recall::testing::MakeTempDir("load_tokenizer");
  for (const std::string& path : {dir + "/x.model", dir + "/x.json", dir + "/x.bin", dir}) {
    auto tok = LoadTokenizer(path, 512);
    ASSERT_FALSE(tok.ok()) << path;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound) << tok.status();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
  }
  std::filesystem::remove_all(dir);
}

// A directory's tokenizer.json that loops (or dangles) is named, not passed over for its
// tokenizer.model or called missing.
TEST(LoadTokenizerTest, ALoopingTokenizerJsonIsNamed) {
  const std::string dir = ::recall::testing::MakeTempDir("load_tokenizer_loop");
  std::filesystem::create_symlink("tokenizer.json", dir + "/tokenizer.json");
  auto tok = LoadTokenizer(dir, 512);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find(dir + "/tokenizer.json: cannot read (Too many levels"),
            std::string::npos)
      << tok.status();
  std::filesystem::remove_all(dir);
}

// A tokenizer file past 256 MiB is refused by its size before it is read (sparse here: one of
// 8 GiB was read whole, 8.5 GB of memory, before it was refused).
TEST(LoadTokenizerTest, AFileOfGigabytesIsRefusedByItsSize) {
  const std::string dir = ::recall::testing::MakeTempDir("load_tokenizer_huge");
  for (const char* name : {"/tok.bin", "/tokenizer.model", "/tokenizer.json"}) {
    const std::string path = dir + name;
    testing::WriteFile(path, "x");
    std::filesystem::resize_file(path, (uintmax_t{256} << 20) + 1);
    auto tok = LoadTokenizer(path, 512);
    ASSERT_FALSE(tok.ok()) << path;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
    EXPECT_EQ(tok.status().message(), path + " is 268435457 bytes; at most 268435456");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace recall::model
