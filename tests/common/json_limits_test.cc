// CheckJsonDepth: nesting counted over arrays and objects, never inside strings.
#include "common/json_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace recall::json_limits {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(CheckJsonDepthTest, AcceptsUpToTheLimitAndRefusesOneMore) {
  EXPECT_TRUE(CheckJsonDepth(Nested(64)).ok());
  const absl::Status s = CheckJsonDepth(Nested(65));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "JSON nests deeper than 64 levels at byte 64");
  EXPECT_TRUE(CheckJsonDepth("{\"a\": [1, {\"b\": []}]}", 4).ok());  // { [ { [
  EXPECT_FALSE(CheckJsonDepth("{\"a\": [1, {\"b\": []}]}", 3).ok());
}

TEST(CheckJsonDepthTest, BracketsInsideStringsAndEscapesDoNotCount) {
  EXPECT_TRUE(CheckJsonDepth("[\"[[[[\", \"\\\"[[[\", \"\\\\\"]", 1).ok());
  // An escaped quote does not end the string; the brackets after it are still inside it.
  EXPECT_TRUE(CheckJsonDepth("[\"\\\"[[\"]", 1).ok());
  // Closing brackets beyond the opened ones never make the depth negative.
  EXPECT_FALSE(CheckJsonDepth("]]]][[", 1).ok());
}

}  // namespace
}  // namespace recall::json_limits
