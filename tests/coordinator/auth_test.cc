// The API keys file: "<key> <tenant>" per line.
#include "coordinator/auth.h"

#include <fstream>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

TEST(ApiKeysTest, KeysMapToTenantsAndBadFilesAreRefusedNamingTheLine) {
  const std::string dir = testing::MakeTempDir("api_keys");
  std::ofstream(dir + "/keys") << "# tenants\nk1 alice\n\nk2 bob  # the second\n";
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load(dir + "/keys");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys->AuthenticateBearer("Bearer k1"), "alice");
  EXPECT_EQ(*keys->AuthenticateBearer("bearer k2"), "bob") << "the scheme is case-insensitive";
  EXPECT_EQ(keys->AuthenticateBearer("Bearer k3").status().code(),
            absl::StatusCode::kUnauthenticated);

  const std::pair<std::string, std::string> bad[] = {
      {"k1 alice\nk1 bob\n", "/twice:2: the key is given twice"},
      {"k1\n", "/one_word:1: expected \"<key> <tenant>\""},
      {"# nothing\n", "/no_keys: no keys"},
  };
  const std::string names[] = {"twice", "one_word", "no_keys"};
  for (size_t i = 0; i < std::size(bad); ++i) {
    const std::string path = dir + "/" + names[i];
    std::ofstream(path) << bad[i].first;
    const absl::Status st = ApiKeys::Load(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(bad[i].second), std::string::npos) << st;
  }
  EXPECT_NE(ApiKeys::Load(dir).status().message().find("is not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace recall::coordinator
