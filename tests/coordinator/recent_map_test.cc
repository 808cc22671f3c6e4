// RecentMap keeps the keys put last: past its capacity the oldest put goes; putting a key
// again makes it the most recent; an erased key is gone.
#include "coordinator/recent_map.h"

#include <string>

#include "gtest/gtest.h"

namespace recall::coordinator {
namespace {

TEST(RecentMapTest, KeepsTheKeysPutLast) {
  RecentMap<int> m(3);
  m.Put("a", 1);
  m.Put("b", 2);
  m.Put("c", 3);
  m.Put("a", 10);  // a is the most recent now: b is the oldest
  m.Put("d", 4);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.Find("b"), nullptr) << "the oldest put went";
  ASSERT_NE(m.Find("a"), nullptr);
  EXPECT_EQ(*m.Find("a"), 10);
  EXPECT_EQ(*m.Find("c"), 3);
  EXPECT_EQ(*m.Find("d"), 4);
  m.Erase("c");
  m.Erase("nothing");
  EXPECT_EQ(m.Find("c"), nullptr);
  m.Put("e", 5);
  m.Put("f", 6);  // a, d, e, f: a goes
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.Find("a"), nullptr);
  EXPECT_EQ(*m.Find("d"), 4);
}

}  // namespace
}  // namespace recall::coordinator
