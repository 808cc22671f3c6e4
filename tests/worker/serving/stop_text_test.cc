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

}  // namespace
}  // namespace recall::serving
