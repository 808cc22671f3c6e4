#include "cache/episodic/segment.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::episodic {
namespace {

std::vector<Utterance> Conversation(int n) {
  std::vector<Utterance> u;
  for (int i = 0; i < n; ++i) u.push_back({i % 2 == 0 ? "Alice" : "Bob", "u" + std::to_string(i)});
  return u;
}

TEST(RenderUtteranceTest, SpeakerSaidQuotedText) {
  EXPECT_EQ(RenderUtterance({"Alice", "Hi there"}), "Alice said, \"Hi there\"");
  // Verbatim: inner quotes are not escaped.
  EXPECT_EQ(RenderUtterance({"Bob", "say \"x\""}), "Bob said, \"say \"x\"\"");
}

// Scenario: 10 utterances in windows of 4 -> [0, 4), [4, 8), [8, 10); the last is shorter.
TEST(SegmentWindowsTest, WindowsOfFourWithShorterLastWindow) {
  const std::vector<Utterance> u = Conversation(10);
  absl::StatusOr<std::vector<Window>> w = SegmentWindows(u);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->size(), 3u);
  EXPECT_EQ((*w)[0].first, 0);
  EXPECT_EQ((*w)[0].count, 4);
  EXPECT_EQ((*w)[1].first, 4);
  EXPECT_EQ((*w)[1].count, 4);
  EXPECT_EQ((*w)[2].first, 8);
  EXPECT_EQ((*w)[2].count, 2);
  EXPECT_EQ((*w)[0].text,
            "Alice said, \"u0\"\nBob said, \"u1\"\nAlice said, \"u2\"\nBob said, \"u3\"");
  EXPECT_EQ((*w)[2].text, "Alice said, \"u8\"\nBob said, \"u9\"");
}

// Scenario: an exact multiple gives full windows only; window_size 1 gives one per utterance;
// a window larger than the conversation gives one window with everything.
TEST(SegmentWindowsTest, ExactMultipleSingleAndOversizedWindows) {
  const std::vector<Utterance> u = Conversation(8);
  absl::StatusOr<std::vector<Window>> four = SegmentWindows(u, 4);
  ASSERT_TRUE(four.ok());
  ASSERT_EQ(four->size(), 2u);
  EXPECT_EQ((*four)[1].count, 4);

  absl::StatusOr<std::vector<Window>> one = SegmentWindows(u, 1);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ((*one)[i].first, i);
    EXPECT_EQ((*one)[i].count, 1);
    EXPECT_EQ((*one)[i].text, RenderUtterance(u[i]));
  }

  absl::StatusOr<std::vector<Window>> big = SegmentWindows(u, 2147483647);
  ASSERT_TRUE(big.ok());
  ASSERT_EQ(big->size(), 1u);
  EXPECT_EQ((*big)[0].count, 8);
}

TEST(SegmentWindowsTest, EmptyConversationHasNoWindows) {
  absl::StatusOr<std::vector<Window>> w = SegmentWindows({}, 4);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->empty());
}

TEST(SegmentWindowsTest, WindowSizeBelowOneIsInvalidArgumentNamingTheLimit) {
  const std::vector<Utterance> u = Conversation(3);
  for (int bad : {0, -4}) {
    absl::StatusOr<std::vector<Window>> w = SegmentWindows(u, bad);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(w.status().message(),
              "segment: window_size must be >= 1, got " + std::to_string(bad));
  }
}

}  // namespace
}  // namespace recall::cache::episodic
