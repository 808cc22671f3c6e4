#include "worker/serving/stop_text.h"

#include "gtest/gtest.h"

namespace recall::serving {
namespace {

TEST(StopTextTest, HoldsBackAPossibleStopPrefixAndCutsAtTheStop) {
  StopText s({"\nuser:"});
  EXPECT_FALSE(s.Append("Hello"));
  EXPECT_EQ(s.TakeReady(), "Hello");
  EXPECT_FALSE(s.Append(" there\nus"));
  EXPECT_EQ(s.TakeReady(), " there");  // "\nus" could start the stop string
  EXPECT_TRUE(s.Append("er: next"));
  EXPECT_EQ(s.text(), "Hello there");
  EXPECT_EQ(s.TakeReady(), "");
  EXPECT_EQ(s.TakeAll(), "");
  EXPECT_TRUE(s.Append("more")) << "appends after the stop are ignored";
  EXPECT_EQ(s.text(), "Hello there");
}

TEST(StopTextTest, ReleasesHeldTextWhenItTurnsOutNotToBeAStop) {
  StopText s({"END"});
  EXPECT_FALSE(s.Append("abcE"));
  EXPECT_EQ(s.TakeReady(), "abc");
  EXPECT_FALSE(s.Append("Nx"));
  EXPECT_EQ(s.TakeReady(), "ENx");
  EXPECT_FALSE(s.Append("EN"));
  EXPECT_EQ(s.TakeAll(), "EN");
}

TEST(StopTextTest, EarliestOfSeveralStopsWins) {
  StopText s({"cd", "bcde"});
  EXPECT_TRUE(s.Append("abcdef"));
  EXPECT_EQ(s.text(), "a");
}

TEST(StopTextTest, NoStopsStreamsEverything) {
  StopText s;
  EXPECT_FALSE(s.Append("x"));
  EXPECT_EQ(s.TakeReady(), "x");
}

// What a stop token's end flushes is not looked at: it cannot cut the text.
TEST(StopTextTest, AnUncheckedPieceIsKeptWhole) {
  StopText s({"ab"});
  EXPECT_FALSE(s.Append("xa"));
  s.AppendUnchecked("by");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.text(), "xaby");
  EXPECT_EQ(s.TakeAll(), "xaby");
}

// ends: text bytes through each token (-1: a character still incomplete after it).
TEST(StopTextTest, TokensBeforeACutEndOnACharacterBoundaryAtOrBeforeIt) {
  const std::vector<int64_t> ends = {3, 5, -1, 9, 12};
  // A cut at 9 keeps four tokens; at 10 too, with byte 9 as the tail of the fifth.
  EXPECT_EQ(TokensBeforeCut(ends, 9, 5).tokens, 4);
  EXPECT_EQ(TokensBeforeCut(ends, 9, 5).tail, 9u);
  EXPECT_EQ(TokensBeforeCut(ends, 10, 5).tokens, 4);
  EXPECT_EQ(TokensBeforeCut(ends, 10, 5).tail, 9u);
  // Inside the character the third token began: back to the second token's end.
  EXPECT_EQ(TokensBeforeCut(ends, 7, 5).tokens, 2);
  EXPECT_EQ(TokensBeforeCut(ends, 7, 5).tail, 5u);
  // At most `limit` tokens (those fed), and none before the first token's end.
  EXPECT_EQ(TokensBeforeCut(ends, 12, 3).tokens, 2);
  EXPECT_EQ(TokensBeforeCut(ends, 2, 5).tokens, 0);
  EXPECT_EQ(TokensBeforeCut(ends, 2, 5).tail, 0u);
  EXPECT_EQ(TokensBeforeCut({}, 0, 0).tokens, 0);
}

}  // namespace
}  // namespace recall::serving
