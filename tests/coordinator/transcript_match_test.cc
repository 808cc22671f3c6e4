// Whole message lists matched against stored transcripts: a list that extends the
// transcript adds only its new messages; one that diverges keeps the common prefix (the
// session is rebuilt in place); a regenerated reply rebuilds from the message before it. The
// index finds, longest first, sessions whose recorded transcript a list extends.
#include "coordinator/transcript_match.h"

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

std::vector<StoredMessage> List(std::initializer_list<std::pair<const char*, const char*>> ms) {
  std::vector<StoredMessage> out;
  for (const auto& [role, content] : ms) out.push_back({role, content});
  return out;
}

// Sessions `ids` of tenant "t" in `store`: the index records transcripts of sessions only.
void MakeSessions(SessionStore& store, std::initializer_list<const char*> ids) {
  for (const char* id : ids) {
    SessionRecord r;
    r.id = id;
    r.tenant = "t";
    r.model = "m";
    ASSERT_TRUE(store.Create(r).ok()) << id;
  }
}

const std::vector<StoredMessage> kStored =
    List({{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", " Once"}});

TEST(MatchTranscriptTest, AListThatExtendsTheTranscriptAddsOnlyItsNewMessages) {
  const TurnMessages m = MatchTranscript(
      kStored,
      List(
          {{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", " Once"}, {"user", "More"}}));
  EXPECT_EQ(m.keep, 3);
  ASSERT_EQ(m.add.size(), 1u);
  EXPECT_EQ(m.add[0].content, "More");
  EXPECT_EQ(MatchTranscript({}, List({{"user", "a"}})).keep, 0) << "a new session";
}

TEST(MatchTranscriptTest, ADivergingListKeepsTheCommonPrefix) {
  // The client edited the reply (byte for byte: a trimmed space is a change).
  const TurnMessages edited = MatchTranscript(
      kStored,
      List({{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", "Once"}, {"user", "More"}}));
  EXPECT_EQ(edited.keep, 2);
  ASSERT_EQ(edited.add.size(), 2u);
  EXPECT_EQ(edited.add[0].role, "assistant");
  // Another system prompt: nothing is kept.
  EXPECT_EQ(MatchTranscript(kStored, List({{"system", "Be terse."}, {"user", "Hi"}})).keep, 0);
  // A different role with the same text is a different message.
  EXPECT_EQ(MatchTranscript(kStored, List({{"user", "Tell a story."}, {"user", "x"}})).keep, 0);
}

// A session whose tail past a list is the list's own stopped turn (its reply interrupted or
// failed) did not go on; one with a complete reply there, a running one, another user
// message (another conversation with the same opening) or a keyed turn did.
TEST(MatchTranscriptTest, OnlyStoppedTurnsOfTheListFromTellsAStoppedTurnFromOneThatWentOn) {
  std::vector<StoredMessage> stored = kStored;
  stored.push_back({"user", "More"});
  stored.push_back({"assistant", " There"});
  std::vector<StoredMessage> again = kStored;  // the list sent again
  again.push_back({"user", "More"});
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, again, 3)) << "a complete reply";
  EXPECT_TRUE(OnlyStoppedTurnsOfTheListFrom(stored, again, 5)) << "nothing past the list";
  for (TurnState state : {TurnState::kInterrupted, TurnState::kFailed}) {
    stored.back().state = state;
    EXPECT_TRUE(OnlyStoppedTurnsOfTheListFrom(stored, again, 3)) << TurnStateName(state);
  }
  // The part of the reply the client got, and a new message: only the stopped reply is past.
  std::vector<StoredMessage> on = again;
  on.push_back({"assistant", " Th"});
  on.push_back({"user", "Go on"});
  EXPECT_TRUE(OnlyStoppedTurnsOfTheListFrom(stored, on, 4));
  std::vector<StoredMessage> other = kStored;
  other.push_back({"user", "Something else"});
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, other, 3)) << "another conversation";
  // Complete on the server, whose writes were all buffered before the client hung up: the
  // client holds a proper prefix of the reply and goes on; not the whole reply, nor another
  // text, nor a prefix with nothing after it, nor a prefix of a reply that is not the last.
  stored.back().state = TurnState::kComplete;
  EXPECT_TRUE(OnlyStoppedTurnsOfTheListFrom(stored, on, 4)) << "the part it read";
  on[4].content = " There";
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, on, 4)) << "the whole reply";
  on[4].content = " Here";
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, on, 4)) << "another text";
  on[4].content = "";
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, on, 4)) << "an empty reply is no part";
  on[4].content = " Th";
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, {on.begin(), on.end() - 1}, 4))
      << "nothing after the part";
  stored.back().state = TurnState::kInProgress;
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, on, 4)) << "a running reply";
  stored.back().state = TurnState::kComplete;
  std::vector<StoredMessage> went_on = stored;
  went_on.push_back({"user", "Go on"});
  went_on.push_back({"assistant", " Then"});
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(went_on, on, 4)) << "not the last reply";
  stored.back().state = TurnState::kInterrupted;
  stored[3].turn_id = "k1";
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, again, 3)) << "resumable by its key";
  stored[3].turn_id.clear();
  stored.back().state = TurnState::kInProgress;  // running: someone's turn, not dropped
  EXPECT_FALSE(OnlyStoppedTurnsOfTheListFrom(stored, again, 3));
}

TEST(MatchTranscriptTest, ARegeneratedReplyRebuildsFromTheMessageBeforeIt) {
  // The list the transcript already holds, up to the user message: ask for the reply again.
  const TurnMessages m =
      MatchTranscript(kStored, List({{"system", "Tell a story."}, {"user", "Hi"}}));
  EXPECT_EQ(m.keep, 1);
  ASSERT_EQ(m.add.size(), 1u);
  EXPECT_EQ(m.add[0].content, "Hi");
}

// A new session made from a list takes the token ids of the replies a stored transcript
// shares with it, up to where they differ, and only of complete replies.
TEST(MatchTranscriptTest, WithReplyTokensCopiesTheSharedRepliesTokenIds) {
  std::vector<StoredMessage> stored = List({{"system", "Tell a story."},
                                            {"user", "Hi"},
                                            {"assistant", " Once"},
                                            {"user", "More"},
                                            {"assistant", " upon"}});
  stored[2].token_ids = {7, 8};
  stored[2].finish = 1;
  stored[4].token_ids = {9};
  stored[4].finish = 2;
  const std::vector<StoredMessage> same = WithReplyTokens(
      List({{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", " Once"}, {"user", "x"}}),
      stored);
  EXPECT_EQ(same[2].token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(same[2].finish, 1);
  EXPECT_TRUE(same[3].token_ids.empty());
  // Past a difference nothing is copied (the second reply follows another user message).
  const std::vector<StoredMessage> other = WithReplyTokens(
      List({{"system", "Tell a story."}, {"user", "Hey"}, {"assistant", " Once"}}), stored);
  EXPECT_TRUE(other[2].token_ids.empty());
  // A reply that was interrupted is not the model's whole reply: not copied.
  stored[2].state = TurnState::kInterrupted;
  EXPECT_TRUE(
      WithReplyTokens(
          List(
              {{"system", "Tell a story."}, {"user", "Hi"}, {"assistant", " Once"}, {"user", "x"}}),
          stored)[2]
          .token_ids.empty());
}

TEST(TranscriptIndexTest, FindsTheLongestRecordedPrefixFirstAndOnlyForItsTenant) {
  TranscriptIndex index(100, nullptr);
  const auto one = List({{"user", "a"}, {"assistant", "b"}});
  const auto two = List({{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}});
  index.Put("t", "s1", one);
  index.Put("t", "s2", two);
  auto request = two;
  request.push_back({"user", "e"});
  const auto found = index.Find("t", request);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0], std::make_pair(4, std::string("s2")));
  EXPECT_EQ(found[1], std::make_pair(2, std::string("s1")));
  EXPECT_TRUE(index.Find("other tenant", request).empty());
  const auto same = index.Find("t", two);
  ASSERT_EQ(same.size(), 1u) << "a list equal to s2's transcript is no continuation of s2";
  EXPECT_EQ(same[0].second, "s1");
}

TEST(TranscriptIndexTest, ASessionIsRecordedOnceAndTheOldestEntriesGoFirst) {
  TranscriptIndex index(2, nullptr);
  const auto a = List({{"user", "a"}, {"assistant", "A"}});
  auto a2 = a;
  a2.push_back({"user", "aa"});
  a2.push_back({"assistant", "AA"});
  index.Put("t", "s1", a);
  index.Put("t", "s1", a2);  // the session went on: its old transcript is forgotten
  EXPECT_EQ(index.size(), 1u);
  auto next = a;
  next.push_back({"user", "?"});
  EXPECT_TRUE(index.Find("t", next).empty());
  index.Put("t", "s2", List({{"user", "b"}, {"assistant", "B"}}));
  index.Put("t", "s3", List({{"user", "c"}, {"assistant", "C"}}));
  EXPECT_EQ(index.size(), 2u) << "bounded";
  auto after = a2;
  after.push_back({"user", "?"});
  EXPECT_TRUE(index.Find("t", after).empty()) << "s1, the least recently used, went first";
  EXPECT_EQ(index.Find("t", List({{"user", "c"}, {"assistant", "C"}, {"user", "?"}})).size(), 1u);
}

// Through the store (another coordinator, or this one after a restart): what one index
// recorded, another finds, per tenant; on a memory miss only the kStoreLookups longest
// prefixes are asked of the store.
TEST(TranscriptIndexTest, AnotherIndexOverTheSameStoreFindsWhatOneRecorded) {
  auto store = OpenStore(testing::MakeTempDir("transcript_index") + "/sessions.db");
  ASSERT_TRUE(store.ok()) << store.status();
  MakeSessions(**store, {"s1", "s2"});
  const auto one = List({{"user", "a"}, {"assistant", "b"}});
  const auto two = List({{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}});
  {
    TranscriptIndex first(100, store->get());
    first.Put("t", "s1", one);
    first.Put("t", "s2", two);
  }
  TranscriptIndex second(100, store->get());
  auto request = two;
  request.push_back({"user", "e"});
  const auto found = second.Find("t", request);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0], std::make_pair(4, std::string("s2")));
  EXPECT_EQ(found[1], std::make_pair(2, std::string("s1")));
  EXPECT_TRUE(second.Find("other tenant", request).empty());
  EXPECT_EQ(second.size(), 2u) << "remembered after the store answered";

  // s1's transcript then five more turns: its prefix is the sixth longest, past the lookups.
  auto longer = one;
  for (int i = 0; i < 5; ++i) {
    longer.push_back({"user", "u" + std::to_string(i)});
    longer.push_back({"assistant", "r" + std::to_string(i)});
  }
  longer.push_back({"user", "?"});
  TranscriptIndex third(100, store->get());
  EXPECT_TRUE(third.Find("t", longer).empty());
  longer.erase(longer.begin() + 8, longer.end() - 1);  // one, then three turns: the fourth
  EXPECT_EQ(third.Find("t", longer), (std::vector<std::pair<int, std::string>>{{2, "s1"}}));
}

// A prefix the memory knows is the longest: shorter ones are not asked of the store (they
// were, up to kStoreLookups reads a request, for candidates behind the one it continues),
// longer ones are (another coordinator's turn since).
TEST(TranscriptIndexTest, TheStoreIsAskedOnlyForPrefixesLongerThanTheMemorysLongest) {
  auto store = OpenStore(testing::MakeTempDir("transcript_index") + "/sessions.db");
  ASSERT_TRUE(store.ok()) << store.status();
  const auto one = List({{"user", "a"}, {"assistant", "b"}});
  const auto two = List({{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}});
  auto three = two;
  three.push_back({"user", "e"});
  three.push_back({"assistant", "f"});
  MakeSessions(**store, {"s1", "s2", "s3"});
  TranscriptIndex other(100, store->get());
  other.Put("t", "s1", one);
  other.Put("t", "s3", three);
  TranscriptIndex index(100, store->get());
  index.Put("t", "s2", two);
  auto request = two;
  request.push_back({"user", "e"});
  EXPECT_EQ(index.Find("t", request), (std::vector<std::pair<int, std::string>>{{4, "s2"}}))
      << "s1's record, shorter than s2's, was read from the store";
  request = three;
  request.push_back({"user", "g"});
  EXPECT_EQ(index.Find("t", request),
            (std::vector<std::pair<int, std::string>>{{6, "s3"}, {4, "s2"}}));
  // A deleted session's records went with it: a coordinator that never saw it finds none.
  ASSERT_TRUE((*store)->Delete("t", "s3").ok());
  TranscriptIndex fresh(100, store->get());
  EXPECT_EQ(fresh.Find("t", request),
            (std::vector<std::pair<int, std::string>>{{4, "s2"}, {2, "s1"}}));
  other.Put("t", "s3", three);  // written after the delete: not kept
  TranscriptIndex later(100, store->get());
  EXPECT_EQ(later.Find("t", request),
            (std::vector<std::pair<int, std::string>>{{4, "s2"}, {2, "s1"}}));
}

}  // namespace
}  // namespace recall::coordinator
