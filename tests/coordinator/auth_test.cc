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
      {"k1 alice\nk1 bob\n", "/twice:2: the key is given twice (a key is one tenant's)"},
      {"k1\n", "/one_word:1: expected \"<key> <tenant>\""},
      {"# nothing\n", "/no_keys: no keys"},
      // Usable over HTTP only (gRPC clients refused it): refused naming the line.
      {"k1 alice\nk\xc3\xa9y bob\n", "/not_ascii:2: the key must be printable ASCII"},
      // A key past what a request's metadata carries was taken, and no request got through.
      {std::string(4097, 'k') + " alice\n", "/long_key:1: the key is 4097 bytes; at most 4096"},
      {"k1 " + std::string(257, 't') + "\n",
       "/long_tenant:1: the tenant is 257 bytes; at most 256"},
  };
  const std::string names[] = {"twice",     "one_word", "no_keys",
                               "not_ascii", "long_key", "long_tenant"};
  for (size_t i = 0; i < std::size(bad); ++i) {
    const std::string path = dir + "/" + names[i];
    std::ofstream(path) << bad[i].first;
    const absl::Status st = ApiKeys::Load(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(bad[i].second), std::string::npos) << st;
  }
  EXPECT_NE(ApiKeys::Load(dir).status().message().find("is not a regular file"), std::string::npos);
}

// A file read again replaces the keys in place (SIGHUP): the object the services hold sees the
// new keys, a removed one is refused.
TEST(ApiKeysTest, ReplaceSwapsInTheKeysOfAFileReadAgain) {
  const std::string dir = testing::MakeTempDir("api_keys_replace");
  std::ofstream(dir + "/a") << "k1 alice\n";
  std::ofstream(dir + "/b") << "k2 bob\nk3 bob\nk4 carol\n";
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load(dir + "/a");
  ASSERT_TRUE(keys.ok()) << keys.status();
  const ApiKeys& held = *keys;
  keys->Replace(*ApiKeys::Load(dir + "/b"));
  EXPECT_EQ(*held.AuthenticateBearer("Bearer k2"), "bob");
  EXPECT_EQ(held.AuthenticateBearer("Bearer k1").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(held.Has("k2"));
  EXPECT_EQ(held.tenants(), 2u);
}

}  // namespace
}  // namespace recall::coordinator
