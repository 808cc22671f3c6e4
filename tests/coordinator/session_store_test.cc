// The SessionStore contract, run against SQLite (a file) and a real redis-server.
#include "coordinator/session_store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "coordinator/create_requests.h"
#include "gtest/gtest.h"
#include "tests/common/redis_server.h"
#include "tests/common/test_util.h"
#include "tests/coordinator/store_sessions.h"

namespace recall::coordinator {
namespace {

// A store at `path` holding one session ("s1" of tenant "a").
absl::StatusOr<std::unique_ptr<SessionStore>> StoreWithOneSession(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SessionStore>> store = OpenStore(path);
  if (!store.ok()) return store;
  SessionRecord r;
  r.id = "s1";
  r.tenant = "a";
  r.model = "m";
  if (absl::Status made = (*store)->Create(r); !made.ok()) return made;
  return store;
}

// The integer a one-value query gives on the SQLite file at `path` (-1 for none).
int QueryInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  int value = -1;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_exec(
        db, sql.c_str(),
        [](void* n, int, char** v, char**) {
          *static_cast<int*>(n) = std::atoi(v[0]);
          return 0;
        },
        &value, nullptr);
  }
  sqlite3_close(db);
  return value;
}

// A store at `path` with 40 sessions of tenant "a" ("s0".."s39"), each with a user message of
// `message_bytes` bytes (none for 0).
void WriteSessions(const std::string& path, int message_bytes) {
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  AddTestSessions(**store, message_bytes);
}

// The ids of the sessions `store` deletes as idle since before `before` (DeleteIdle).
std::vector<std::string> DeleteIdleIds(SessionStore& store, int64_t before) {
  auto gone = store.DeleteIdle(before, 10);
  EXPECT_TRUE(gone.ok()) << gone.status();
  std::vector<std::string> ids;
  if (gone.ok()) {
    for (const IdleSession& s : *gone) ids.push_back(s.id);
  }
  return ids;
}

class SessionStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("store_" + GetParam());
    if (GetParam() == "redis") {
      if (!testing::RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed";
      ASSERT_TRUE(redis_.Start(dir_));
      url_ = redis_.url();
    } else {
      url_ = dir_ + "/sessions.db";
    }
    auto store = OpenStore(url_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  static SessionRecord Record(const std::string& id, const std::string& tenant) {
    SessionRecord r;
    r.id = id;
    r.tenant = tenant;
    r.model = "m";
    r.cache_settings = std::string("\x0a\x04lazy", 6);  // binary-safe
    r.metadata = {{"user", "ann"}};
    r.created_unix_ms = 1234;
    return r;
  }

  // redis-cli's exit status for `args` on the test's Redis.
  int RedisCli(const std::string& args) {
    return std::system(
        ("redis-cli -p " + std::to_string(redis_.port()) + " " + args + " > /dev/null").c_str());
  }

  std::string dir_, url_;
  testing::RedisServer redis_;
  std::unique_ptr<SessionStore> store_;
};

TEST_P(SessionStoreTest, CreateGetAppendTruncateBind) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  EXPECT_EQ(store_->Create(Record("s1", "b")).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(store_->Append("a", "s1", 0, {"user", "hi \xc3\xa9"}).ok());
  ASSERT_TRUE(store_->Append("a", "s1", 1, {"assistant", "hello"}).ok());
  EXPECT_EQ(store_->Append("a", "s1", 1, {"user", "late"}).code(),
            absl::StatusCode::kFailedPrecondition)
      << "appends must come in order";
  auto r = store_->Get("a", "s1");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->cache_settings, std::string("\x0a\x04lazy", 6));
  EXPECT_EQ(r->metadata.at("user"), "ann");
  EXPECT_EQ(r->created_unix_ms, 1234);
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0].content, "hi \xc3\xa9");
  EXPECT_EQ(r->message_count, 2);
  ASSERT_TRUE(store_->Truncate("a", "s1", 1).ok());
  EXPECT_EQ(store_->Get("a", "s1")->messages.size(), 1u);
  ASSERT_TRUE(store_->Bind("a", "s1", "w:1").ok());
  EXPECT_EQ(store_->Get("a", "s1")->worker, "w:1");
}

// Two messages equal in what a prompt and a replay read.
void ExpectSameMessage(const StoredMessage& a, const StoredMessage& b, int index) {
  EXPECT_EQ(a.role, b.role) << "message " << index;
  EXPECT_EQ(a.content, b.content) << "message " << index;
  EXPECT_EQ(a.token_ids, b.token_ids) << "message " << index;
  EXPECT_EQ(a.state, b.state) << "message " << index;
  EXPECT_EQ(a.turn_id, b.turn_id) << "message " << index;
}

TEST_P(SessionStoreTest, GetRecentGivesTheLastTurnsAndCountsTheEarlierOnesAsAPromptWould) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  // A system prompt, complete turns, a failed turn, an interrupted one with two user
  // messages, a turn whose reply streamed in parts, and the last turn (its user message has
  // a turn id).
  std::vector<StoredMessage> all = {{"system", "be brief"}};
  const auto reply = [](const std::string& text, TurnState state) {
    StoredMessage m{"assistant", text};
    m.token_ids = {1, 2, 3};
    m.finish = 2;
    m.state = state;
    return m;
  };
  for (int i = 0; i < 30; ++i) {
    StoredMessage user{"user", "question " + std::to_string(i)};
    user.turn_id = "t" + std::to_string(i);
    all.push_back(user);
    if (i == 7) {
      all.push_back(reply("", TurnState::kFailed));
    } else if (i == 12) {
      all.push_back({"user", "and also"});
      all.push_back(reply("half", TurnState::kInterrupted));
    } else {
      all.push_back(reply("answer " + std::to_string(i), TurnState::kComplete));
    }
  }
  ASSERT_TRUE(store_->AppendAll("a", "s1", 0, all).ok());
  // The last reply streams in parts (merged by reads).
  const int last = static_cast<int>(all.size()) - 1;
  StoredMessage streaming = all.back();
  streaming.content = "ans";
  streaming.token_ids = {1};
  streaming.state = TurnState::kInProgress;
  ASSERT_TRUE(store_->Replace("a", "s1", last, streaming).ok());
  StoredMessage delta{"assistant", "wer 29"};
  delta.token_ids = {2, 3};
  StoredMessage whole = all.back();
  whole.state = TurnState::kInProgress;
  ASSERT_TRUE(store_->AppendReply("a", "s1", last, delta, whole).ok());
  all.back().state = TurnState::kInProgress;

  const auto check = [&](const std::string& turn_id, int expected_first) {
    auto full = store_->Get("a", "s1");
    auto recent = store_->GetRecent("a", "s1", turn_id);
    ASSERT_TRUE(full.ok() && recent.ok()) << recent.status();
    EXPECT_EQ(recent->message_count, static_cast<int>(all.size()));
    EXPECT_EQ(recent->model, "m");
    const int first = recent->first_message;
    EXPECT_EQ(first, expected_first) << "turn id \"" << turn_id << "\"";
    ASSERT_EQ(first + static_cast<int>(recent->messages.size()), recent->message_count);
    EXPECT_TRUE(first == 0 || all[static_cast<size_t>(first - 1)].role == "assistant")
        << "starts mid-turn at " << first;
    EXPECT_EQ(recent->earlier_in_prompt,
              static_cast<int>(CompleteTurns(full->messages, first).size()));
    for (size_t i = 0; i < recent->messages.size(); ++i) {
      ExpectSameMessage(recent->messages[i], full->messages[first + i],
                        first + static_cast<int>(i));
    }
  };
  check("", last - 1);  // the last turn: its user message and its reply
  check("t3", 7);       // from turn t3's user message (index 7) on
  check("t12", 25);     // from turn t12's (the interrupted one's) user message on
  check("nope", last - 1);
  auto recent = store_->GetRecent("a", "s1", "");
  ASSERT_TRUE(recent.ok()) << recent.status();
  EXPECT_EQ(recent->first_message, last - 1) << "the last turn only";
  EXPECT_EQ(recent->earlier_in_prompt, last - 1 - 2 - 3)
      << "the failed turn's two messages and the interrupted turn's three are left out";
  EXPECT_EQ(store_->GetRecent("b", "s1", "").status().code(), absl::StatusCode::kNotFound);
  // The index follows a rewritten tail and a truncation.
  ASSERT_TRUE(store_
                  ->ReplaceTail("a", "s1", 25, static_cast<int>(all.size()),
                                {all[25], all[26], all[27], all[28]}, "")
                  .ok());
  all.resize(29);
  check("t13", 28);  // the last message is t13's, after the interrupted reply at 27
  check("t12", 25);
  ASSERT_TRUE(store_->Truncate("a", "s1", 27).ok());
  all.resize(27);
  check("", 25);
  check("t13", 25);  // gone with its message
}

// Writes of a coordinator from before the Redis index (it keeps none): the index is derived
// again from the messages, so reads stay right.
TEST_P(SessionStoreTest, ARedisIndexBehindAnOlderCoordinatorsWritesIsDerivedAgain) {
  if (GetParam() != "redis") GTEST_SKIP() << "Redis only";
  ASSERT_EQ(std::system("command -v redis-cli > /dev/null"), 0) << "redis-cli is missing";
  const auto complete_count = [&](const std::string& id, const std::string& turn_id) {
    auto full = store_->Get("a", id);
    auto recent = store_->GetRecent("a", id, turn_id);
    EXPECT_TRUE(full.ok() && recent.ok()) << recent.status();
    if (!full.ok() || !recent.ok()) return -1;
    EXPECT_EQ(recent->earlier_in_prompt,
              static_cast<int>(CompleteTurns(full->messages, recent->first_message).size()));
    return recent->first_message;
  };
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage failed{"assistant", ""};
  failed.state = TurnState::kFailed;
  StoredMessage user{"user", "q"};
  user.turn_id = "t1";
  ASSERT_TRUE(store_
                  ->AppendAll("a", "s1", 0,
                              {user,
                               failed,
                               {"user", "q2"},
                               {"assistant", "a2"},
                               {"user", "q3"},
                               {"assistant", "a3"}})
                  .ok());
  EXPECT_EQ(complete_count("s1", ""), 4);
  // An old coordinator's append (the length changes), then one of ours: derived again.
  ASSERT_EQ(RedisCli("RPUSH recall:m:s1 '{\"content\":\"old\",\"role\":\"user\"}'"), 0);
  ASSERT_TRUE(store_->Append("a", "s1", 7, {"assistant", "a4"}).ok());
  EXPECT_EQ(complete_count("s1", ""), 6);
  // An old coordinator's rewrite of a message in place (the length stays): the failed reply
  // is now complete, which the index does not know.
  ASSERT_EQ(RedisCli("LSET recall:m:s1 1 '{\"content\":\"fixed\",\"role\":\"assistant\"}'"), 0);
  EXPECT_EQ(complete_count("s1", "t1"), 0);  // t1 is message 0
  EXPECT_EQ(complete_count("s1", ""), 6);
  // An old coordinator's delete leaves the index sets; the session made again under the id
  // does not inherit them.
  ASSERT_EQ(RedisCli("DEL recall:s:s1 recall:m:s1"), 0);
  ASSERT_EQ(RedisCli("ZREM recall:t:a s1"), 0);
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage late{"user", "again"};
  late.turn_id = "t1";
  ASSERT_TRUE(store_
                  ->AppendAll("a", "s1", 0,
                              {{"user", "x"},
                               {"assistant", "y"},
                               {"user", "z"},
                               {"assistant", "w"},
                               late,
                               {"assistant", "v"}})
                  .ok());
  auto recent = store_->GetRecent("a", "s1", "t1");
  ASSERT_TRUE(recent.ok()) << recent.status();
  EXPECT_EQ(recent->first_message, 4);
  ASSERT_FALSE(recent->messages.empty());
  EXPECT_EQ(recent->messages[0].content, "again");
}

TEST_P(SessionStoreTest, TenantsSeeOnlyTheirSessions) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  EXPECT_EQ(store_->Get("b", "s1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Append("b", "s1", 0, {"user", "x"}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Delete("b", "s1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->CountSessions("b"), 0);
  EXPECT_EQ(*store_->CountSessions("a"), 1);
  ASSERT_TRUE(store_->Delete("a", "s1").ok());
  EXPECT_EQ(store_->Get("a", "s1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->CountSessions("a"), 0);
}

// A tenant's session limit is counted and kept in the store's one step: with Redis, the
// stores of two coordinators creating at once hold it (each passed a count-then-create by one).
TEST_P(SessionStoreTest, CreateHoldsTheTenantsLimitAcrossStores) {
  ASSERT_TRUE(store_->Create(Record("s1", "a"), 2).ok());
  ASSERT_TRUE(store_->Create(Record("s2", "a"), 2).ok());
  const absl::Status full = store_->Create(Record("s3", "a"), 2);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(full.message(), "the tenant has reached its limit of 2 sessions");
  EXPECT_EQ(store_->Get("a", "s3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Create(Record("s1", "a"), 2).code(), absl::StatusCode::kAlreadyExists)
      << "a taken id is said first";
  EXPECT_TRUE(store_->Create(Record("b1", "b"), 2).ok()) << "another tenant's count";
  ASSERT_TRUE(store_->Delete("a", "s1").ok());
  EXPECT_TRUE(store_->Create(Record("s3", "a"), 2).ok());
  if (GetParam() != "redis") return;  // one coordinator per SQLite file
  auto other = OpenStore(url_);
  ASSERT_TRUE(other.ok()) << other.status();
  std::atomic<int> made{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      SessionStore& store = t % 2 == 0 ? *store_ : **other;
      for (int i = 0; i < 8; ++i) {
        if (store.Create(Record(absl::StrCat("c", t, "-", i), "c"), 5).ok()) ++made;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(made.load(), 5);
  EXPECT_EQ(*store_->CountSessions("c"), 5);
}

// AddRecord adds a record only when none is kept (a claim); DeleteRecord forgets one while it
// holds the value given.
TEST_P(SessionStoreTest, AddRecordClaimsOnceAndDeleteRecordForgets) {
  ASSERT_TRUE(store_->AddRecord("a", "c:x", "first").ok());
  EXPECT_EQ(store_->AddRecord("a", "c:x", "second").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*store_->GetRecord("a", "c:x"), "first");
  EXPECT_TRUE(store_->AddRecord("b", "c:x", "b's").ok()) << "per tenant";
  ASSERT_TRUE(store_->DeleteRecord("a", "c:x", "other").ok());
  EXPECT_EQ(*store_->GetRecord("a", "c:x"), "first") << "another value is kept";
  ASSERT_TRUE(store_->DeleteRecord("a", "c:x", "first").ok());
  EXPECT_TRUE(store_->DeleteRecord("a", "c:x", "first").ok()) << "none: OK";
  EXPECT_EQ(store_->GetRecord("a", "c:x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->AddRecord("a", "c:x", "again").ok());
}

// A session's records go with it (Delete and DeleteIdle), unless another writer took them
// over since; none is written for a session that is not there.
TEST_P(SessionStoreTest, ASessionsRecordsAreForgottenWithIt) {
  for (const char* id : {"s1", "s2", "s3"}) ASSERT_TRUE(store_->Create(Record(id, "a")).ok());
  EXPECT_EQ(store_->PutSessionRecord("a", "none", "t:0", "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->PutSessionRecord("b", "s1", "t:0", "x").code(), absl::StatusCode::kNotFound)
      << "another tenant's session";
  EXPECT_EQ(store_->GetRecord("a", "t:0").status().code(), absl::StatusCode::kNotFound);
  for (const char* name : {"t:1", "t:2", "t:3", "t:4"}) {
    ASSERT_TRUE(store_->PutSessionRecord("a", "s1", name, "1:s1").ok());
  }
  ASSERT_TRUE(store_->PutSessionRecord("a", "s2", "t:2", "1:s2").ok()) << "s2's now";
  ASSERT_TRUE(store_->PutRecord("a", "t:3", "plain").ok()) << "nobody's now";
  ASSERT_TRUE(store_->AddSessionRecord("a", "s3", "t:5", "1:s3").ok());
  EXPECT_EQ(store_->AddSessionRecord("a", "s3", "t:5", "2:s3").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->AddSessionRecord("a", "none", "t:6", "1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->GetRecord("a", "t:5"), "1:s3");
  ASSERT_TRUE(store_->PutRecord("a", "k:1", "kept").ok());

  ASSERT_TRUE(store_->Delete("a", "s1").ok());
  for (const char* name : {"t:1", "t:4"}) {
    EXPECT_EQ(store_->GetRecord("a", name).status().code(), absl::StatusCode::kNotFound) << name;
  }
  EXPECT_EQ(*store_->GetRecord("a", "t:2"), "1:s2");
  EXPECT_EQ(*store_->GetRecord("a", "t:3"), "plain");
  EXPECT_EQ(*store_->GetRecord("a", "k:1"), "kept");

  std::vector<std::string> idle = DeleteIdleIds(*store_, UnixMillis() + 1);
  std::sort(idle.begin(), idle.end());  // made in one millisecond, maybe
  EXPECT_EQ(idle, std::vector<std::string>({"s2", "s3"}));
  for (const char* name : {"t:2", "t:5"}) {
    EXPECT_EQ(store_->GetRecord("a", name).status().code(), absl::StatusCode::kNotFound) << name;
  }
  EXPECT_EQ(*store_->GetRecord("a", "t:3"), "plain");
  EXPECT_EQ(*store_->GetRecord("a", "k:1"), "kept");
}

// Redis: a session's list of its records keeps those of the last day only (each write prunes
// the expired), so a session that lives for weeks does not hold one entry per turn.
TEST_P(SessionStoreTest, ARedisSessionsRecordListDropsTheExpired) {
  if (GetParam() != "redis") GTEST_SKIP() << "Redis's list of a session's records";
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  const std::string cli = "redis-cli -p " + std::to_string(redis_.port()) + " ";
  // An entry that expired an hour ago (its record long gone).
  ASSERT_EQ(RedisCli("ZADD recall:o:s1 1 5:gone!x"), 0);
  ASSERT_TRUE(store_->PutSessionRecord("a", "s1", "t:1", "1:s1").ok());
  ASSERT_TRUE(store_->PutSessionRecord("a", "s1", "t:2", "2:s1").ok());
  const testing::Exit count = testing::RunToExit(cli + "ZCARD recall:o:s1");
  EXPECT_EQ(count.output, "2\n") << "the expired entry went with the first write";
  ASSERT_TRUE(store_->Delete("a", "s1").ok());
  EXPECT_EQ(store_->GetRecord("a", "t:2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(testing::RunToExit(cli + "EXISTS recall:o:s1").output, "0\n");
}

// One CreateSession request id sent to two coordinators at once (two stores on one Redis;
// on SQLite, two CreateRequests on its one store) makes one session, which every request
// gets: each replica made one.
TEST_P(SessionStoreTest, ARequestIdSentToTwoCoordinatorsAtOnceMakesOneSession) {
  std::unique_ptr<SessionStore> second;
  if (GetParam() == "redis") {
    auto opened = OpenStore(url_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    second = std::move(*opened);
  }
  SessionStore& other = second != nullptr ? *second : *store_;
  CreateRequests replicas[2] = {CreateRequests(*store_), CreateRequests(other)};
  std::atomic<int> made{0};
  std::vector<std::string> ids(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      SessionStore& store = t % 2 == 0 ? *store_ : other;
      auto got =
          replicas[t % 2].Once("a", "req-1", "digest", [&]() -> absl::StatusOr<SessionRecord> {
            SessionRecord r = Record(absl::StrCat("s", t), "a");
            RECALL_RETURN_IF_ERROR(store.Create(r));
            ++made;
            return r;
          });
      ids[t] = got.ok() ? got->id : got.status().ToString();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(made.load(), 1);
  for (const std::string& id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_EQ(*store_->CountSessions("a"), 1);
}

TEST_P(SessionStoreTest, ListPagesInIdOrder) {
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(store_->Create(Record("s" + std::to_string(i), "a")).ok());
  ASSERT_TRUE(store_->Create(Record("x", "b")).ok());
  ASSERT_TRUE(store_->Append("a", "s2", 0, {"user", "hi"}).ok());
  auto first = store_->List("a", "", 3);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->size(), 3u);
  EXPECT_EQ((*first)[2].id, "s2");
  EXPECT_EQ((*first)[2].message_count, 1);
  auto rest = store_->List("a", "s2", 10);
  ASSERT_EQ(rest->size(), 4u);
  EXPECT_EQ(rest->front().id, "s3");
}

// A store damaged outside the coordinator (a hand edit, another writer): a session whose
// metadata is not a JSON object of strings is DataLoss naming it from Get, not a crash; the
// others still read, and a listing holds them all.
TEST_P(SessionStoreTest, DamagedMetadataIsDataLossNotACrash) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  ASSERT_TRUE(store_->Create(Record("s2", "a")).ok());
  for (const std::string bad : {"{bad", "[1, 2]", "{\"user\": 7}"}) {
    SCOPED_TRACE(bad);
    std::string cmd;
    if (GetParam() == "redis") {
      cmd = "redis-cli -p " + std::to_string(redis_.port()) + " HSET recall:s:s1 metadata '" + bad +
            "' > /dev/null";
    } else {
      cmd = "sqlite3 " + url_ + " \"UPDATE sessions SET metadata = '" + bad + "' WHERE id = 's1'\"";
    }
    if (std::system(("command -v " + cmd.substr(0, cmd.find(' ')) + " > /dev/null").c_str()) != 0) {
      GTEST_SKIP() << cmd.substr(0, cmd.find(' ')) << " is not installed";
    }
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto got = store_->Get("a", "s1");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_NE(got.status().message().find("\"s1\""), std::string::npos) << got.status();
    EXPECT_TRUE(store_->Get("a", "s2").ok());
    // A listing holds both: the damaged one without its metadata (so it can be found and
    // deleted), the other whole.
    const auto listed = store_->List("a", "", 10);
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->size(), 2u);
    EXPECT_EQ((*listed)[0].id, "s1");
    EXPECT_TRUE((*listed)[0].metadata.empty());
    EXPECT_EQ((*listed)[0].model, "m");
    EXPECT_EQ((*listed)[1].id, "s2");
    EXPECT_EQ((*listed)[1].metadata.at("user"), "ann");
  }
}

TEST_P(SessionStoreTest, DataSurvivesReopening) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  ASSERT_TRUE(store_->Append("a", "s1", 0, {"user", "kept"}).ok());
  store_.reset();
  auto again = OpenStore(url_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Get("a", "s1")->messages.at(0).content, "kept");
}

// A turn's messages and its reply's place go in as one write; the reply is replaced as it
// grows and ends, its state and tokens kept; replacing where there is no message is refused;
// a start marks in-progress turns interrupted (SQLite), or their lease does (Redis).
TEST_P(SessionStoreTest, TurnsAreWrittenWholeAndTheirRepliesReplaced) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage reply{"assistant", ""};
  reply.state = TurnState::kInProgress;
  reply.lease_unix_ms = 1;  // long past
  ASSERT_TRUE(store_->AppendAll("a", "s1", 0, {{"user", "hi"}, reply}).ok());
  EXPECT_EQ(store_->AppendAll("a", "s1", 1, {{"user", "x"}, {"user", "y"}}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Get("a", "s1")->messages.size(), 2u) << "a refused write adds nothing";
  StoredMessage partial = reply;
  partial.content = " Once";
  partial.token_ids = {5, 6};
  partial.lease_unix_ms = 4102444800000;  // 2100
  ASSERT_TRUE(store_->Replace("a", "s1", 1, partial).ok());
  auto rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->messages.size(), 2u);
  EXPECT_EQ(rec->messages[1].content, " Once");
  EXPECT_EQ(rec->messages[1].token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(rec->messages[1].state, TurnState::kInProgress);
  EXPECT_EQ(store_->Replace("a", "s1", 2, partial).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Replace("b", "s1", 1, partial).code(), absl::StatusCode::kNotFound);
  auto marked = store_->InterruptInProgress();
  ASSERT_TRUE(marked.ok()) << marked.status();
  if (GetParam() == "sqlite") {
    EXPECT_EQ(*marked, 1);
    EXPECT_EQ(store_->Get("a", "s1")->messages[1].state, TurnState::kInterrupted);
  } else {
    EXPECT_EQ(*marked, 0) << "replicas share Redis: leases decide";
    EXPECT_EQ(store_->Get("a", "s1")->messages[1].state, TurnState::kInProgress);
    partial.lease_unix_ms = 1;
    ASSERT_TRUE(store_->Replace("a", "s1", 1, partial).ok());
    EXPECT_EQ(store_->Get("a", "s1")->messages[1].state, TurnState::kInterrupted)
        << "a lease that passed reads as interrupted";
  }
  StoredMessage done{"assistant", " Once upon"};
  done.finish = 1;
  ASSERT_TRUE(store_->Replace("a", "s1", 1, done).ok());
  EXPECT_EQ(store_->Get("a", "s1")->messages[1].state, TurnState::kComplete);
  EXPECT_EQ(store_->Get("a", "s1")->messages[1].finish, 1);
}

// A user message's turn id (ConverseRequest.turn_id) is kept, through a reopening; other
// messages have none.
TEST_P(SessionStoreTest, TurnIdsAreKept) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage user{"user", "hi"};
  user.turn_id = "turn-1:a_b.c";
  StoredMessage reply{"assistant", ""};
  reply.state = TurnState::kInProgress;
  ASSERT_TRUE(store_->AppendAll("a", "s1", 0, {user, reply}).ok());
  StoredMessage done{"assistant", " Once"};
  ASSERT_TRUE(store_->Replace("a", "s1", 1, done).ok());
  ASSERT_TRUE(store_->Append("a", "s1", 2, {"user", "no id"}).ok());
  store_.reset();
  auto again = OpenStore(url_);
  ASSERT_TRUE(again.ok()) << again.status();
  auto rec = (*again)->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->messages.size(), 3u);
  EXPECT_EQ(rec->messages[0].turn_id, "turn-1:a_b.c");
  EXPECT_EQ(rec->messages[1].turn_id, "");
  EXPECT_EQ(rec->messages[1].content, " Once");
  EXPECT_EQ(rec->messages[2].turn_id, "");
}

// A reply written as it streams (AppendReply, a delta per write) reads whole, through a
// reopening and once marked interrupted; replacing it writes it whole once (not the parts
// again); truncating drops it; a delta where no reply is in progress is refused (SQLite).
TEST_P(SessionStoreTest, RepliesWrittenPartByPartReadWhole) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage whole{"assistant", ""};
  whole.state = TurnState::kInProgress;
  whole.lease_unix_ms = 4102444800000;  // 2100
  whole.seed = 0xFEDCBA9876543210ull;   // past 2^53: no double holds it
  ASSERT_TRUE(store_->AppendAll("a", "s1", 0, {{"user", "hi"}, whole}).ok());
  const std::vector<std::pair<std::string, std::vector<int32_t>>> deltas = {
      {" Once", {5}}, {" upon", {6, 7}}, {"", {8}}, {" a time", {9}}};
  for (const auto& [text, ids] : deltas) {
    StoredMessage delta;
    delta.content = text;
    delta.token_ids = ids;
    whole.content += text;
    whole.token_ids.insert(whole.token_ids.end(), ids.begin(), ids.end());
    ASSERT_TRUE(store_->AppendReply("a", "s1", 1, delta, whole).ok());
  }
  const auto reply = [&](SessionStore& store) {
    auto rec = store.Get("a", "s1");
    EXPECT_TRUE(rec.ok()) << rec.status();
    return rec.ok() && rec->messages.size() == 2 ? rec->messages[1] : StoredMessage{};
  };
  EXPECT_EQ(reply(*store_).content, " Once upon a time");
  EXPECT_EQ(reply(*store_).token_ids, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(reply(*store_).state, TurnState::kInProgress);
  EXPECT_EQ(reply(*store_).seed, 0xFEDCBA9876543210ull) << "the turn's seed, kept";
  store_.reset();
  auto again = OpenStore(url_);
  ASSERT_TRUE(again.ok()) << again.status();
  store_ = std::move(*again);
  EXPECT_EQ(reply(*store_).content, " Once upon a time");
  if (GetParam() == "sqlite") {
    ASSERT_TRUE(store_->InterruptInProgress().ok());
    EXPECT_EQ(reply(*store_).state, TurnState::kInterrupted);
    EXPECT_EQ(reply(*store_).content, " Once upon a time");
    EXPECT_EQ(reply(*store_).seed, 0xFEDCBA9876543210ull);
    StoredMessage none;
    none.content = "x";
    EXPECT_EQ(store_->AppendReply("a", "s1", 1, none, whole).code(),
              absl::StatusCode::kFailedPrecondition)
        << "no reply in progress";
    EXPECT_EQ(store_->AppendReply("b", "s1", 1, none, whole).code(),
              absl::StatusCode::kFailedPrecondition)
        << "another tenant's";
  }
  StoredMessage done = whole;
  done.state = TurnState::kComplete;
  done.lease_unix_ms = 0;
  ASSERT_TRUE(store_->Replace("a", "s1", 1, done).ok());
  EXPECT_EQ(reply(*store_).content, " Once upon a time") << "whole once, not the parts again";
  EXPECT_EQ(reply(*store_).token_ids, (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(reply(*store_).seed, 0xFEDCBA9876543210ull);
  // Parts of a second reply, then the transcript truncated before it: nothing of it stays.
  StoredMessage next{"assistant", ""};
  next.state = TurnState::kInProgress;
  ASSERT_TRUE(store_->AppendAll("a", "s1", 2, {{"user", "more"}, next}).ok());
  StoredMessage delta;
  delta.content = " The";
  delta.token_ids = {10};
  next.content = " The";
  next.token_ids = {10};
  ASSERT_TRUE(store_->AppendReply("a", "s1", 3, delta, next).ok());
  ASSERT_TRUE(store_->Truncate("a", "s1", 2).ok());
  ASSERT_TRUE(store_->AppendAll("a", "s1", 2, {{"user", "other"}, {"assistant", " A"}}).ok());
  auto rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->messages.size(), 4u);
  EXPECT_EQ(rec->messages[3].content, " A") << "the dropped reply's parts went with it";
  EXPECT_TRUE(rec->messages[3].token_ids.empty());
  EXPECT_FALSE(rec->messages[3].seed.has_value());
  EXPECT_FALSE(rec->messages[0].seed.has_value());
}

// A turn rewriting the transcript's tail (a diverging message list; a refused turn put
// back) is one write: the old tail and its reply parts out, the new messages in; refused
// with nothing changed when the count is not the one read (another turn changed it). On
// Redis, a damaged reply part does not stop it halfway: the part is dropped.
TEST_P(SessionStoreTest, ATailIsReplacedInOneWriteOrNotAtAll) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage streaming{"assistant", ""};
  streaming.state = TurnState::kInProgress;
  ASSERT_TRUE(store_
                  ->AppendAll("a", "s1", 0,
                              {{"user", "u1"}, {"assistant", "a1"}, {"user", "u2"}, streaming})
                  .ok());
  StoredMessage delta;
  delta.content = " part";
  delta.token_ids = {7};
  streaming.content = " part";
  ASSERT_TRUE(store_->AppendReply("a", "s1", 3, delta, streaming).ok());
  const auto contents = [&] {
    std::vector<std::string> out;
    auto rec = store_->Get("a", "s1");
    EXPECT_TRUE(rec.ok()) << rec.status();
    if (rec.ok()) {
      for (const StoredMessage& m : rec->messages) out.push_back(m.content);
    }
    return out;
  };
  EXPECT_EQ(store_->ReplaceTail("a", "s1", 2, 3, {{"user", "x"}}, "").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(contents(), (std::vector<std::string>{"u1", "a1", "u2", " part"})) << "unchanged";
  if (GetParam() == "redis" && std::system("command -v redis-cli > /dev/null") == 0) {
    // A damaged part (Get reads the session as DataLoss while it is there).
    const std::string cmd = "redis-cli -p " + std::to_string(redis_.port()) +
                            " RPUSH recall:p:s1 '{not json' > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  ASSERT_TRUE(store_->ReplaceTail("a", "s1", 2, 4, {{"user", "u3"}, {"assistant", "a3"}}, "").ok());
  EXPECT_EQ(contents(), (std::vector<std::string>{"u1", "a1", "u3", "a3"}))
      << "the old tail's reply parts went with it";
  ASSERT_TRUE(store_->ReplaceTail("a", "s1", 4, 4, {{"user", "u4"}}, "").ok());
  EXPECT_EQ(contents(), (std::vector<std::string>{"u1", "a1", "u3", "a3", "u4"}));
  EXPECT_EQ(store_->ReplaceTail("b", "s1", 0, 5, {}, "").code(), absl::StatusCode::kNotFound)
      << "another tenant's";
}

// Redis, shared by coordinators: a reply in progress keeps its writer's id, and a write of
// another writer into it (a coordinator whose lease lapsed, its turn resumed by another) is
// refused; its own writer's, or one of unknown writer, goes in.
TEST_P(SessionStoreTest, AReplyInProgressTakesWritesOfItsWriterOnly) {
  if (GetParam() != "redis") GTEST_SKIP() << "SQLite keeps no writer: one coordinator owns it";
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage whole{"assistant", ""};
  whole.state = TurnState::kInProgress;
  whole.lease_unix_ms = 4102444800000;  // 2100
  whole.writer = "c-one";
  ASSERT_TRUE(store_->AppendAll("a", "s1", 0, {{"user", "hi"}, whole}).ok());
  auto rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->messages[1].writer, "c-one");
  StoredMessage delta;
  delta.content = " Once";
  delta.token_ids = {5};
  whole.content = " Once";
  whole.token_ids = {5};
  ASSERT_TRUE(store_->AppendReply("a", "s1", 1, delta, whole).ok());
  StoredMessage other = whole;
  other.writer = "c-two";
  EXPECT_EQ(store_->AppendReply("a", "s1", 1, delta, other).code(),
            absl::StatusCode::kFailedPrecondition);
  StoredMessage unknown = whole;
  unknown.writer.clear();
  EXPECT_TRUE(store_->AppendReply("a", "s1", 1, delta, unknown).ok());
  rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->messages[1].content, " Once Once") << "the refused write left nothing";
  // Its end, written whole: refused from another writer while the lease is live, taken from
  // its own; a lapsed lease is taken over by anyone.
  StoredMessage end{"assistant", "theirs"};
  end.writer = "c-two";
  EXPECT_EQ(store_->Replace("a", "s1", 1, end).code(), absl::StatusCode::kFailedPrecondition);
  end.writer = "c-one";
  end.content = "mine";
  ASSERT_TRUE(store_->Replace("a", "s1", 1, end).ok());
  StoredMessage lapsed{"assistant", "old"};
  lapsed.state = TurnState::kInProgress;
  lapsed.lease_unix_ms = 1;  // long past
  lapsed.writer = "c-one";
  ASSERT_TRUE(store_->Replace("a", "s1", 1, lapsed).ok());
  StoredMessage takeover{"assistant", "new"};
  takeover.state = TurnState::kInProgress;
  takeover.lease_unix_ms = 4102444800000;
  takeover.writer = "c-two";
  EXPECT_TRUE(store_->Replace("a", "s1", 1, takeover).ok());
  rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->messages[1].content, "new");
  EXPECT_EQ(rec->messages[1].writer, "c-two");
  // While c-two's reply runs, c-one cannot rewrite or extend the transcript under it.
  EXPECT_EQ(store_->ReplaceTail("a", "s1", 1, 2, {{"assistant", "x"}}, "c-one").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ReplaceTail("a", "s1", 2, 2, {{"user", "x"}}, "c-one").code(),
            absl::StatusCode::kFailedPrecondition);
  // c-two completes it; c-one's late end (interrupted) does not overwrite the complete reply.
  StoredMessage complete{"assistant", "new, complete"};
  complete.writer = "c-two";
  ASSERT_TRUE(store_->Replace("a", "s1", 1, complete).ok());
  StoredMessage late{"assistant", "old"};
  late.state = TurnState::kInterrupted;
  late.writer = "c-one";
  EXPECT_EQ(store_->Replace("a", "s1", 1, late).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->ReplaceTail("a", "s1", 2, 2, {{"user", "next"}}, "c-one").ok());
  rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->messages.size(), 3u);
  EXPECT_EQ(rec->messages[1].content, "new, complete");
}

// A store file with one page overwritten (a disk fault): whichever page it is, every call that
// fails says DATA_LOSS (the file is damaged), never UNAVAILABLE, which clients retry
// forever. One page of the schema or an index, read on prepare, answered "retryable".
TEST(SqliteDamageTest, APageOverwrittenIsDataLossWhereverItIs) {
  const std::string dir = testing::MakeTempDir("store_damage");
  const std::string clean = dir + "/clean.db";
  ASSERT_NO_FATAL_FAILURE(WriteSessions(clean, /*message_bytes=*/300));
  const auto size = std::filesystem::file_size(clean);
  ASSERT_GE(size, 4u * 4096);
  int refused = 0, failed = 0;
  for (uintmax_t page = 0; page * 4096 < size; ++page) {
    SCOPED_TRACE("page " + std::to_string(page));
    const std::string path = dir + "/damaged" + std::to_string(page) + ".db";
    std::filesystem::copy_file(clean, path);
    testing::OverwriteBytes(path, static_cast<int64_t>(page * 4096), 4096, '\xff');
    auto store = OpenStore(path, StoreRisks{.allow_loss = true});  // the calls' answers
    if (!store.ok()) {
      EXPECT_NE(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
      ++refused;
      continue;
    }
    SessionRecord r;
    r.id = "new";
    r.tenant = "a";
    r.model = "m";
    const std::vector<absl::Status> answers = {
        (*store)->CountSessions("a").status(), (*store)->List("a", "", 100).status(),
        (*store)->Get("a", "s7").status(), (*store)->Create(r),
        (*store)->Append("a", "s3", 1, {"assistant", "y"})};
    for (const absl::Status& st : answers) {
      EXPECT_NE(st.code(), absl::StatusCode::kUnavailable) << st;
      failed += st.code() == absl::StatusCode::kDataLoss;
    }
  }
  std::printf("%d damaged files refused at open, %d calls answered DATA_LOSS\n", refused, failed);
  EXPECT_GT(refused + failed, 0) << "the damage was seen somewhere";
}

// A damaged index page (a lookup that silently misses sessions) is refused at open (DataLoss),
// naming the file, the repair and --allow-store-loss, with nothing written to the file; with
// allow_loss it is said, and the store opens and serves what it can read.
TEST(SqliteDamageTest, ADamagedIndexIsSaidAtOpen) {
  const std::string path = testing::MakeTempDir("store_index_damage") + "/sessions.db";
  ASSERT_NO_FATAL_FAILURE(WriteSessions(path, /*message_bytes=*/0));
  ::testing::internal::CaptureStderr();
  { ASSERT_TRUE(OpenStore(path).ok()); }
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("is damaged"), std::string::npos)
      << "a sound file opens silently";
  const int root =
      QueryInt(path, "SELECT rootpage FROM sqlite_master WHERE name = 'sessions_by_tenant'");
  ASSERT_GT(root, 0);
  testing::OverwriteBytes(path, int64_t{root - 1} * 4096, 4096, '\xff');
  const auto before = std::filesystem::last_write_time(path);
  auto refused = OpenStore(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  for (const std::string& part : {"session store " + path + ": it is damaged (",
                                  std::string(".recover"), std::string("--allow-store-loss")}) {
    EXPECT_NE(refused.status().message().find(part), std::string::npos) << refused.status();
  }
  EXPECT_EQ(std::filesystem::last_write_time(path), before) << "nothing written";
  ::testing::internal::CaptureStderr();
  auto store = OpenStore(path, StoreRisks{.allow_loss = true});
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(said.find("session store " + path + ": it is damaged"), std::string::npos) << said;
  EXPECT_NE(said.find(".recover"), std::string::npos) << said;
  EXPECT_TRUE((*store)->Get("a", "s1").ok()) << "its sessions are served";
}

// A file damaged where its opening reads (its first page) is refused saying how to repair it;
// one damaged in the messages' table opens (said, with the repair), and marking the turns a
// previous run left streaming is DATA_LOSS, which a coordinator's start goes past.
TEST(SqliteDamageTest, DamageSaysHowToRepairItAndAMessagesPageDoesNotStopTheOpen) {
  const std::string dir = testing::MakeTempDir("store_damage_repair");
  const std::string first = dir + "/first.db", messages = dir + "/messages.db";
  ASSERT_NO_FATAL_FAILURE(WriteSessions(first, /*message_bytes=*/300));
  std::filesystem::copy_file(first, messages);
  testing::OverwriteBytes(first, 100, 3900, '\xab');
  auto refused = OpenStore(first);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("sqlite3 " + first + " .recover | sqlite3 NEW.db"),
            std::string::npos)
      << refused.status();

  const int root = QueryInt(messages, "SELECT rootpage FROM sqlite_master WHERE name = 'messages'");
  ASSERT_GT(root, 0);
  testing::OverwriteBytes(messages, int64_t{root - 1} * 4096, 4096, '\xab');
  EXPECT_EQ(OpenStore(messages).status().code(), absl::StatusCode::kDataLoss);
  ::testing::internal::CaptureStderr();
  auto store = OpenStore(messages, StoreRisks{.allow_loss = true});
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(said.find(".recover"), std::string::npos) << said;
  // What could be read went into a new file (sqlite_salvage.h), which takes writes: the
  // damaged one failed them (DATA_LOSS) and is kept beside it.
  EXPECT_NE(said.find("copied what could be read into a new " + messages), std::string::npos)
      << said;
  EXPECT_TRUE((*store)->InterruptInProgress().ok());
  auto listed = (*store)->List("a", "", 100);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 40u) << "every session, whose rows were not on the damaged page";
  EXPECT_TRUE((*store)->Get("a", "s1").ok());
  EXPECT_TRUE((*store)->Append("a", "s1", 0, {"user", "again"}).ok() ||
              (*store)->Append("a", "s1", 1, {"user", "again"}).ok());
  int kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    kept += entry.path().filename().string().rfind("messages.db.damaged-", 0) == 0;
  }
  EXPECT_GE(kept, 1) << "the damaged file is kept";
}

// --allow-store-loss on a file with a damaged page of messages in the middle of a long
// transcript: the rows past the page are read again (a scan stopped at it), and the transcript
// keeps the messages before the first it lost (a hole would be served as a conversation that
// never happened); another session is whole.
TEST(SqliteDamageTest, SalvageReadsPastADamagedPageAndCutsATranscriptAtItsHole) {
  const std::string path = testing::MakeTempDir("store_salvage") + "/sessions.db";
  {
    auto store = OpenStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (const char* id : {"long", "other"}) {
      SessionRecord r;
      r.id = id;
      r.tenant = "a";
      r.model = "m";
      ASSERT_TRUE((*store)->Create(r).ok());
    }
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE((*store)
                      ->Append("a", "long", i,
                               {i % 2 == 0 ? "user" : "assistant",
                                absl::StrCat("m", i, "-", std::string(300, 'x'))})
                      .ok());
    }
    ASSERT_TRUE((*store)->Append("a", "other", 0, {"user", "hello"}).ok());
  }
  // The page holding message 100.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("m100-x");
  ASSERT_NE(at, std::string::npos);
  testing::OverwriteBytes(path, static_cast<int64_t>(at / 4096 * 4096), 4096, '\xee');
  ::testing::internal::CaptureStderr();
  auto store = OpenStore(path, StoreRisks{.allow_loss = true});
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(said.find("1 transcript(s) cut at a lost message"), std::string::npos) << said;
  auto rec = (*store)->Get("a", "long");
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_GT(rec->messages.size(), 80u);
  EXPECT_LE(rec->messages.size(), 100u);
  for (size_t i = 0; i < rec->messages.size(); ++i) {
    EXPECT_EQ(rec->messages[i].content.substr(0, rec->messages[i].content.find('-')),
              absl::StrCat("m", i));
  }
  auto other = (*store)->Get("a", "other");
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->messages.size(), 1u);
  EXPECT_EQ(other->messages[0].content, "hello") << "past the damaged page, read again";
  struct stat mode;
  ASSERT_EQ(::stat(path.c_str(), &mode), 0);
  EXPECT_EQ(mode.st_mode & 0777, 0600u) << "its owner's only, as the damaged one was";
}

// A salvage stopped after its new file was complete (its marker written) is finished at the
// next start: the new file takes the damaged one's place, the damaged log goes (SQLite would
// replay it into the new file), the marker too. Without the marker a leftover new file is
// not used.
TEST(SqliteDamageTest, ASalvageStoppedMidSwapIsFinishedAtTheNextStart) {
  const std::string dir = testing::MakeTempDir("store_swap");
  const std::string path = dir + "/sessions.db";
  ASSERT_NO_FATAL_FAILURE(WriteSessions(dir + "/new.db", /*message_bytes=*/10));
  ASSERT_NO_FATAL_FAILURE(WriteSessions(path, /*message_bytes=*/0));
  {
    auto store = OpenStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Delete("a", "s5").ok());  // tells the two files apart
  }
  std::filesystem::copy_file(dir + "/new.db", path + ".salvage");
  std::ofstream(path + "-wal") << "the damaged file's log";
  std::ofstream(path + ".salvage-done") << path << ".damaged-1\n";
  ::testing::internal::CaptureStderr();
  auto store = OpenStore(path);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(said.find("finished the salvage an earlier start began"), std::string::npos) << said;
  EXPECT_TRUE((*store)->Get("a", "s5").ok()) << "the new file is served";
  EXPECT_FALSE(std::filesystem::exists(path + ".salvage"));
  EXPECT_FALSE(std::filesystem::exists(path + ".salvage-done"));
  ASSERT_TRUE((*store)->Delete("a", "s5").ok());
  store->reset();
  std::filesystem::copy_file(dir + "/new.db", path + ".salvage",
                             std::filesystem::copy_options::overwrite_existing);
  auto again = OpenStore(path);  // no marker: the leftover is not the store
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->Get("a", "s5").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::exists(path + ".salvage")) << "left for the next salvage";
}

// A reply's bytes with a seed, and bytes written before seeds were kept (finish, then ids),
// which read as before.
TEST(ReplyBytesTest, SeedsRoundTripAndOldBytesReadWithout) {
  StoredMessage m{"assistant", "x"};
  m.finish = 1;
  m.token_ids = {-2, 7, 70000};
  m.seed = 0xFFFFFFFF00000001ull;
  StoredMessage back;
  DecodeReply(EncodeReply(m), &back);
  EXPECT_EQ(back.seed, m.seed);
  EXPECT_EQ(back.finish, 1);
  EXPECT_EQ(back.token_ids, m.token_ids);
  m.seed.reset();
  const std::string old = EncodeReply(m);
  EXPECT_EQ(old.size(), 16u) << "finish and three ids, as before";
  back.seed = 5;
  DecodeReply(old, &back);
  EXPECT_FALSE(back.seed.has_value());
  EXPECT_EQ(back.token_ids, m.token_ids);
  StoredMessage seed_only{"assistant", ""};
  seed_only.seed = 0;
  DecodeReply(EncodeReply(seed_only), &back);
  EXPECT_EQ(back.seed, 0u);
  EXPECT_TRUE(back.token_ids.empty());
  DecodeReply(std::string("\xfe\xff\xff\xff", 4), &back);  // a marker cut short
  EXPECT_FALSE(back.seed.has_value());
  EXPECT_TRUE(back.token_ids.empty());
}

// Taken-back attempts before the seed: they round-trip, a reply without them reads as before,
// and a count past the bytes is not read past them (nor does it crash).
TEST(ReplyBytesTest, TakenBackAttemptsRoundTripAndABadCountIsNotReadPastTheEnd) {
  StoredMessage m{"assistant", "x"};
  m.finish = 2;
  m.token_ids = {7, 8};
  m.seed = 3;
  m.taken_back = {{{10, 11, 12}, 2}, {{}, 0, /*own=*/true}};
  StoredMessage back;
  DecodeReply(EncodeReply(m), &back);
  ASSERT_EQ(back.taken_back.size(), 2u);
  EXPECT_FALSE(back.taken_back[0].own);
  EXPECT_TRUE(back.taken_back[1].own);
  EXPECT_EQ(back.taken_back[0].token_ids, (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(back.taken_back[0].prompt_tokens, 2);
  EXPECT_TRUE(back.taken_back[1].token_ids.empty());
  EXPECT_EQ(back.seed, 3u);
  EXPECT_EQ(back.finish, 2);
  EXPECT_EQ(back.token_ids, m.token_ids);
  StoredMessage only{"assistant", ""};
  only.taken_back = {{{4}, 1}};
  DecodeReply(EncodeReply(only), &back);
  ASSERT_EQ(back.taken_back.size(), 1u);
  EXPECT_EQ(back.finish, 0);
  EXPECT_TRUE(back.token_ids.empty());
  std::string bad = EncodeReply(m);
  bad[8] = '\x7f';  // the first attempt's count: far past the end
  DecodeReply(bad, &back);
  EXPECT_TRUE(back.taken_back.empty());
  EXPECT_TRUE(back.token_ids.empty());
}

// An interrupted reply's taken-back attempts (a worker gave back what an aborted turn of an
// evicting session fed) are kept with it, through both stores, for a later rebuild.
TEST_P(SessionStoreTest, AnInterruptedReplyKeepsItsTakenBackAttempts) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  StoredMessage reply{"assistant", ""};
  reply.state = TurnState::kInProgress;
  ASSERT_TRUE(store_->AppendAll("a", "s1", 0, {{"user", "hi"}, reply}).ok());
  StoredMessage ended{"assistant", " Once"};
  ended.state = TurnState::kInterrupted;
  ended.token_ids = {5, 6};
  ended.seed = 9;
  ended.taken_back = {{{1, 2, 3, 5}, 3}, {{4}, 1, /*own=*/true}};
  ASSERT_TRUE(store_->Replace("a", "s1", 1, ended).ok());
  auto rec = store_->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  const StoredMessage& back = rec->messages[1];
  EXPECT_EQ(back.state, TurnState::kInterrupted);
  EXPECT_EQ(back.token_ids, ended.token_ids);
  EXPECT_EQ(back.seed, ended.seed);
  ASSERT_EQ(back.taken_back.size(), 2u);
  EXPECT_EQ(back.taken_back[0].token_ids, (std::vector<int32_t>{1, 2, 3, 5}));
  EXPECT_EQ(back.taken_back[0].prompt_tokens, 3);
  EXPECT_EQ(back.taken_back[1].token_ids, (std::vector<int32_t>{4}));
  EXPECT_EQ(back.taken_back[1].prompt_tokens, 1);
  EXPECT_FALSE(back.taken_back[0].own);
  EXPECT_TRUE(back.taken_back[1].own) << "an attempt of this reply (a resume leaves it out)";
}

// Idempotency-Key records: per tenant, replaced by a later write, binary safe, kept across a
// reopening; a key never written is NotFound.
TEST_P(SessionStoreTest, RecordsArePerTenantReplacedAndKept) {
  EXPECT_EQ(store_->GetRecord("a", "k1").status().code(), absl::StatusCode::kNotFound);
  const std::string bytes("c\x00\xff:2:ab", 8);
  ASSERT_TRUE(store_->PutRecord("a", "k1", "s-first").ok());
  ASSERT_TRUE(store_->PutRecord("a", "k1", bytes).ok());
  ASSERT_TRUE(store_->PutRecord("b", "k1", "s-theirs").ok());
  // (tenant, key) pairs that would concatenate alike stay apart.
  ASSERT_TRUE(store_->PutRecord("ab", "c", "s-ab").ok());
  ASSERT_TRUE(store_->PutRecord("a", "bc", "s-a").ok());
  store_.reset();
  auto again = OpenStore(url_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*(*again)->GetRecord("a", "k1"), bytes);
  EXPECT_EQ(*(*again)->GetRecord("b", "k1"), "s-theirs");
  EXPECT_EQ(*(*again)->GetRecord("ab", "c"), "s-ab");
  EXPECT_EQ(*(*again)->GetRecord("a", "bc"), "s-a");
  EXPECT_EQ((*again)->GetRecord("c", "k1").status().code(), absl::StatusCode::kNotFound);
}

// SQLite: a record older than a day reads as absent and goes at the next write.
// One coordinator per sessions.db: a second store on the same file is refused by name while
// the first is open (it would mark the first's running turns interrupted), and opens once
// the first is closed.
TEST(SqliteStoreTest, ASecondStoreOnTheSameFileIsRefusedWhileTheFirstIsOpen) {
  const std::string path = testing::MakeTempDir("store_lock") + "/sessions.db";
  auto first = OpenStore(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = OpenStore(path);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("in use by another coordinator"), std::string::npos)
      << second.status();
  EXPECT_NE(second.status().message().find("--store redis://"), std::string::npos)
      << second.status();
  first->reset();
  auto third = OpenStore(path);
  EXPECT_TRUE(third.ok()) << third.status();
}

// A message index past what a transcript reaches (a damaged row) makes its session DATA_LOSS;
// the others are listed and read. (It went through an int: a turn's planner saw a negative
// number of messages and the coordinator aborted.)
TEST(SqliteStoreTest, AMessageIndexPastAnyTranscriptIsDataLoss) {
  const std::string path = testing::MakeTempDir("store_idx") + "/sessions.db";
  ASSERT_NO_FATAL_FAILURE(WriteSessions(path, /*message_bytes=*/10));
  for (const char* idx : {"2147483647", "9223372036854775806"}) {
    SCOPED_TRACE(idx);
    QueryInt(path, std::string("UPDATE messages SET idx = ") + idx + " WHERE session_id = 's1'");
    auto store = OpenStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    const auto got = (*store)->Get("a", "s1");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_NE(got.status().message().find(std::string("has a message at index ") + idx),
              std::string::npos)
        << got.status();
    EXPECT_EQ((*store)->GetRecent("a", "s1", "").status().code(), absl::StatusCode::kDataLoss);
    const auto listed = (*store)->List("a", "", 100);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->size(), 40u);
    EXPECT_TRUE((*store)->Get("a", "s2").ok());
  }
}

// A damaged page is DATA_LOSS, not a retryable UNAVAILABLE (retrying does not mend a file),
// and not a crash.
TEST(SqliteStoreTest, ADamagedPageIsDataLoss) {
  const std::string path = testing::MakeTempDir("store_damaged") + "/sessions.db";
  ASSERT_TRUE(StoreWithOneSession(path).ok());  // closed again
  const int root = QueryInt(path, "SELECT rootpage FROM sqlite_master WHERE name = 'sessions'");
  const int page_size = QueryInt(path, "PRAGMA page_size");
  ASSERT_GT(root, 1);
  ASSERT_GT(page_size, 0);
  {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(root - 1) * page_size, SEEK_SET), 0);
    const std::string junk(page_size, '\x5a');
    ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
    std::fclose(f);
  }
  auto store = OpenStore(path);
  absl::Status st = store.status();
  if (store.ok()) st = (*store)->Get("a", "s1").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("damaged"), std::string::npos) << st;
}

// A file whose tables have other columns (another program's) is refused at open, naming
// the column, and left as it was; it used to open and fail every request as "retryable".
TEST(SqliteStoreTest, AFileWithOtherColumnsIsRefusedAtOpen) {
  const std::string path = testing::MakeTempDir("store_foreign") + "/sessions.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE messages(x INT, y INT)", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const auto store = OpenStore(path);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find("its table messages has no column session_id"),
            std::string::npos)
      << store.status();
  EXPECT_EQ(QueryInt(path, "SELECT COUNT(*) FROM pragma_table_info('messages')"), 2)
      << "no column was added to a file that is not the store's";
}

// Another program's database (a table of its own) was taken over without a word, our tables
// made beside its; a sessions table without tenant failed at its index ("no such column:
// tenant"). Both are refused by name, and the file is left as it was.
TEST(SqliteStoreTest, AnotherProgramsDatabaseIsRefusedNamingWhatIsForeign) {
  const std::string dir = testing::MakeTempDir("store_other_program");
  for (const auto& [sql, expect] :
       {std::pair<const char*, const char*>{"CREATE TABLE foo(a, b)",
                                            "holds table(s) foo of no session store: not a "
                                            "Recall session store"},
        {"CREATE TABLE sessions(id TEXT PRIMARY KEY, name TEXT)",
         "its table sessions has no column tenant: not a Recall session store"}}) {
    const std::string path = dir + "/" + std::to_string(std::hash<std::string>()(sql)) + ".db";
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
    const auto store = OpenStore(path);
    ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
    EXPECT_NE(store.status().message().find(expect), std::string::npos) << store.status();
    EXPECT_EQ(QueryInt(path, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'"), 1)
        << "no table was added";
  }
}

// A first start that failed before its schema was written (a full disk, a kill) leaves an
// empty file beside an empty lock: no store was lost, and the next start makes it (it was
// refused as an emptied store, "restore the file from a backup"). Once made, the lock says
// so, and the same file emptied is refused.
TEST(SqliteStoreTest, AnEmptyFileNoStoreWasMadeInOpensAndAnEmptiedOneIsRefused) {
  const std::string path = testing::MakeTempDir("store_never_made") + "/sessions.db";
  std::ofstream(path).close();
  std::ofstream(path + ".lock").close();
  { ASSERT_TRUE(OpenStore(path).ok()) << OpenStore(path).status(); }
  std::filesystem::resize_file(path, 0);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  const auto refused = OpenStore(path);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  // Moved away (as a refusal advises) and a new empty file in its place, as a first start
  // that failed leaves it: a new store, not an emptied one (the lock names the old file).
  std::filesystem::rename(path, path + ".old");
  std::ofstream(path).close();
  EXPECT_TRUE(OpenStore(path).ok()) << OpenStore(path).status();
}

// A new store file, its log and its lock are their owner's only (they were 0644: every local
// user could read every tenant's transcripts); an existing file others may read is said.
TEST(SqliteStoreTest, ANewStoreIsItsOwnersOnlyAndAReadableOneIsSaid) {
  const std::string path = testing::MakeTempDir("store_mode") + "/sessions.db";
  {
    auto store = StoreWithOneSession(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (const std::string& file : {path, path + "-wal", path + ".lock"}) {  // while open
      struct stat st;
      ASSERT_EQ(::stat(file.c_str(), &st), 0) << file;
      EXPECT_EQ(st.st_mode & 0777, 0600u) << file;
    }
  }
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ::testing::internal::CaptureStderr();
  { ASSERT_TRUE(OpenStore(path).ok()); }
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("other users of this machine may read it (mode 0644): chmod 600"),
            std::string::npos)
      << said;
}

// A store records its layout's version (PRAGMA user_version); one written by a newer
// coordinator is refused by an older one instead of being changed under it.
TEST(SqliteStoreTest, AStoreOfANewerVersionIsRefused) {
  const std::string path = testing::MakeTempDir("store_version") + "/sessions.db";
  { ASSERT_TRUE(OpenStore(path).ok()); }
  EXPECT_EQ(QueryInt(path, "PRAGMA user_version"), 1);
  { ASSERT_TRUE(OpenStore(path).ok()) << "its own version opens"; }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 7", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const auto store = OpenStore(path);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find("was written by a newer coordinator (store version 7; "
                                          "this one knows up to 1)"),
            std::string::npos)
      << store.status();
  EXPECT_EQ(QueryInt(path, "PRAGMA user_version"), 7) << "left as it was";
}

// A store path that is a directory, or under a directory that does not exist, is said so
// (SQLite said "unable to open database file", the lock "cannot open PATH.lock").
TEST(SqliteStoreTest, APathThatIsADirectoryOrUnderNoneIsSaidSo) {
  const std::string dir = testing::MakeTempDir("store_paths");
  auto a = OpenStore(dir);
  EXPECT_EQ(a.status().message(), "session store " + dir +
                                      " is a directory; name the database "
                                      "file (" +
                                      dir + "/sessions.db)")
      << a.status();
  auto b = OpenStore("sqlite://" + dir + "/nope/x/s.db");
  EXPECT_EQ(b.status().message(), "session store " + dir + "/nope/x/s.db: its directory " + dir +
                                      "/nope/x does not exist")
      << b.status();
  EXPECT_FALSE(std::filesystem::exists(dir + "/nope"));
}

TEST(SqliteStoreTest, RecordsOlderThanADayAreForgotten) {
  const std::string path = testing::MakeTempDir("store_keys") + "/sessions.db";
  {
    auto store = OpenStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutRecord("a", "old", "s1").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const std::string age = "UPDATE records SET written_ms = written_ms - " +
                          std::to_string(SessionStore::kRecordTtlMs + 1000);
  ASSERT_EQ(sqlite3_exec(db, age.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->GetRecord("a", "old").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*store)->PutRecord("a", "new", "s2").ok());
  store->reset();
  EXPECT_EQ(QueryInt(path, "SELECT COUNT(*) FROM records"), 1) << "the old record was purged";
}

// --session-ttl's deletes (IdleSessions): a session is idle from when its last turn began (or
// it was made); the oldest go first, at most `limit`; one whose reply is being written under
// a live lease stays; a deleted session is gone for its tenant.
TEST_P(SessionStoreTest, IdleSessionsAreDeletedOldestFirstButNotOneWhoseReplyIsBeingWritten) {
  const auto tick = [] { std::this_thread::sleep_for(std::chrono::milliseconds(5)); };
  for (const char* id : {"old", "busy", "talking"}) {
    ASSERT_TRUE(store_->Create(Record(id, "a")).ok());
    tick();
  }
  StoredMessage reply{"assistant", "once"};
  reply.state = TurnState::kInProgress;
  reply.lease_unix_ms = UnixMillis() + 60000;  // its coordinator is writing it
  ASSERT_TRUE(store_->ReplaceTail("a", "busy", 0, 0, {{"user", "hi"}, reply}, "").ok());
  tick();
  const int64_t before_talk = UnixMillis();
  tick();
  ASSERT_TRUE(store_->Create(Record("new", "a")).ok());
  tick();
  ASSERT_TRUE(store_->ReplaceTail("a", "talking", 0, 0, {{"user", "hi"}}, "").ok());  // a turn

  auto gone = store_->DeleteIdle(before_talk, 10);
  ASSERT_TRUE(gone.ok()) << gone.status();
  std::vector<std::string> ids;
  for (const IdleSession& s : *gone) ids.push_back(s.tenant + "/" + s.id);
  EXPECT_EQ(ids, std::vector<std::string>({"a/old"}))
      << "busy is writing its reply; talking began a turn since; new was made since";
  EXPECT_EQ(store_->Get("a", "old").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*store_->CountSessions("a"), 3);

  gone = store_->DeleteIdle(UnixMillis() + 1, 1);  // all are idle by then: the oldest first
  ASSERT_TRUE(gone.ok()) << gone.status();
  ASSERT_EQ(gone->size(), 1u);
  EXPECT_EQ((*gone)[0].id, "new") << "busy stays while its lease is live; new is the oldest then";
  reply.lease_unix_ms = 1;  // its coordinator died long ago (a write: activity)
  tick();                   // (in talking's millisecond, the two tied and came in either order)
  ASSERT_TRUE(store_->Replace("a", "busy", 1, reply).ok());
  ASSERT_TRUE(store_->Bind("a", "busy", "w:1").ok());
  gone = store_->DeleteIdle(UnixMillis() + 1, 10);
  ASSERT_TRUE(gone.ok()) << gone.status();
  ASSERT_EQ(gone->size(), 2u);
  EXPECT_EQ((*gone)[0].id, "talking");
  EXPECT_EQ((*gone)[1].id, "busy") << "its reply's write was its latest activity";
  EXPECT_EQ((*gone)[1].worker, "w:1") << "its worker's cache is dropped";
  EXPECT_EQ(*store_->CountSessions("a"), 0);
  EXPECT_TRUE(store_->List("a", "", 10)->empty());
  gone = store_->DeleteIdle(UnixMillis() + 1, 10);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(gone->empty());
  // An id made again is a new session, active from its making.
  ASSERT_TRUE(store_->Create(Record("old", "b")).ok());
  EXPECT_TRUE(store_->DeleteIdle(before_talk, 10)->empty());
  // A reply that ends (or is resumed) is activity too.
  ASSERT_TRUE(store_->ReplaceTail("b", "old", 0, 0, {{"user", "hi"}, reply}, "").ok());
  tick();
  const int64_t before_end = UnixMillis();
  tick();
  ASSERT_TRUE(store_->Replace("b", "old", 1, {"assistant", "once upon"}).ok());
  EXPECT_TRUE(store_->DeleteIdle(before_end, 10)->empty());
}

// Redis: the store's layout version is written at the first open (recall:layout); a store of a
// newer layout, or a key of that name holding something else, is refused naming it.
TEST_P(SessionStoreTest, ARedisStoreOfANewerLayoutIsRefused) {
  if (GetParam() != "redis") GTEST_SKIP() << "Redis only (SQLite: SqliteStoreTest)";
  ASSERT_EQ(std::system("command -v redis-cli > /dev/null"), 0) << "redis-cli is missing";
  ASSERT_EQ(RedisCli("GET recall:layout | grep -qx 1"), 0) << "written at the first open";
  ASSERT_TRUE(OpenStore(url_).ok()) << "the same layout opens again";
  ASSERT_EQ(RedisCli("SET recall:layout 2"), 0);
  absl::StatusOr<std::unique_ptr<SessionStore>> newer = OpenStore(url_);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(newer.status().message().find(
                "was written by a newer coordinator (store layout 2; this one knows up to 1)"),
            std::string::npos)
      << newer.status();
  ASSERT_EQ(RedisCli("SET recall:layout banana"), 0);
  absl::StatusOr<std::unique_ptr<SessionStore>> other = OpenStore(url_);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("recall:layout holds \"banana\""), std::string::npos)
      << other.status();
  ASSERT_EQ(RedisCli("SET recall:layout 01"), 0);
  EXPECT_EQ(OpenStore(url_).status().code(), absl::StatusCode::kFailedPrecondition)
      << "not as a coordinator writes it";
  ASSERT_EQ(RedisCli("DEL recall:layout"), 0);
  ASSERT_EQ(RedisCli("RPUSH recall:layout 1"), 0);
  absl::StatusOr<std::unique_ptr<SessionStore>> list = OpenStore(url_);
  EXPECT_NE(list.status().message().find("recall:layout holds \"(not a string)\""),
            std::string::npos)
      << list.status();
}

// Redis: sessions an older coordinator made (not in recall:a) count as active from the first
// open of the store that keeps activity, once; later ones are not touched again.
TEST_P(SessionStoreTest, RedisSessionsFromBeforeActivityWasKeptCountAsActiveFromTheFirstOpen) {
  if (GetParam() != "redis") GTEST_SKIP() << "Redis only (SQLite: the test below)";
  ASSERT_EQ(std::system("command -v redis-cli > /dev/null"), 0) << "redis-cli is missing";
  ASSERT_TRUE(store_->Create(Record("old", "a")).ok());
  ASSERT_EQ(RedisCli("ZREM recall:a old"), 0);  // as an older coordinator left it
  ASSERT_EQ(RedisCli("DEL recall:a:complete"), 0);
  EXPECT_TRUE(DeleteIdleIds(*store_, UnixMillis() + 1).empty()) << "not known to be idle";
  const int64_t before_open = UnixMillis();
  auto reopened = OpenStore(url_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_TRUE(DeleteIdleIds(**reopened, before_open).empty()) << "active as of the open";
  EXPECT_EQ(DeleteIdleIds(**reopened, UnixMillis() + 1), std::vector<std::string>({"old"}));
}

TEST(SqliteStoreTest, SessionsOfAFileFromBeforeActivityWasKeptCountAsActiveWhenItOpens) {
  const std::string path = testing::MakeTempDir("store_active") + "/sessions.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* old_schema = R"sql(
CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, model TEXT NOT NULL,
  cache BLOB NOT NULL, metadata TEXT NOT NULL, created_ms INTEGER NOT NULL,
  worker TEXT NOT NULL DEFAULT '');
INSERT INTO sessions VALUES ('s1', 'a', 'm', x'', '{}', 1, '');
)sql";
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, &err), SQLITE_OK) << err;
  sqlite3_close(db);
  const int64_t before_open = UnixMillis();
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(DeleteIdleIds(**store, before_open).empty())
      << "made in 1970, but active as of the upgrade";
  EXPECT_EQ(DeleteIdleIds(**store, UnixMillis() + 1), std::vector<std::string>({"s1"}));
  // A session an older coordinator added since (no activity: 0) counts as active from the
  // next open, not as idle since 1970.
  store->reset();
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "INSERT INTO sessions (id, tenant, model, cache, metadata, created_ms) "
                         "VALUES ('s2', 'a', 'm', x'', '{}', 1)",
                         nullptr, nullptr, &err),
            SQLITE_OK)
      << err;
  sqlite3_close(db);
  const int64_t before_reopen = UnixMillis();
  store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(DeleteIdleIds(**store, before_reopen).empty()) << "active as of the reopen";
}

// A session file written before turn ids were kept opens with the column added: its messages
// have none, and new ones keep theirs.
TEST(SqliteStoreTest, AFileFromBeforeTurnIdsGetsTheColumn) {
  const std::string path = testing::MakeTempDir("store_old") + "/sessions.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* old_schema = R"sql(
CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, model TEXT NOT NULL,
  cache BLOB NOT NULL, metadata TEXT NOT NULL, created_ms INTEGER NOT NULL,
  worker TEXT NOT NULL DEFAULT '');
CREATE TABLE messages (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  idx INTEGER NOT NULL, role TEXT NOT NULL, content BLOB NOT NULL,
  reply BLOB NOT NULL DEFAULT x'', state INTEGER NOT NULL DEFAULT 0,
  lease_ms INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session_id, idx));
INSERT INTO sessions VALUES ('s1', 'a', 'm', x'', '{}', 1, '');
INSERT INTO messages (session_id, idx, role, content) VALUES ('s1', 0, 'user', 'old');
)sql";
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, &err), SQLITE_OK) << err;
  sqlite3_close(db);
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  StoredMessage user{"user", "new"};
  user.turn_id = "t2";
  ASSERT_TRUE((*store)->Append("a", "s1", 1, user).ok());
  auto rec = (*store)->Get("a", "s1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->messages.size(), 2u);
  EXPECT_EQ(rec->messages[0].content, "old");
  EXPECT_EQ(rec->messages[0].turn_id, "");
  EXPECT_EQ(rec->messages[1].turn_id, "t2");
}

// A file whose records were kept before they had sessions gets the column: its records are
// read as before and new ones go with their sessions.
TEST(SqliteStoreTest, AFileFromBeforeSessionRecordsGetsTheColumn) {
  const std::string path = testing::MakeTempDir("store_old_records") + "/sessions.db";
  {
    auto store = OpenStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    SessionRecord r;
    r.id = "s1";
    r.tenant = "a";
    r.model = "m";
    ASSERT_TRUE((*store)->Create(r).ok());
    ASSERT_TRUE((*store)->PutRecord("a", "t:old", "1:s1").ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  ASSERT_EQ(sqlite3_exec(db,
                         "DROP INDEX records_by_session; ALTER TABLE records DROP COLUMN session; "
                         "PRAGMA user_version = 0",
                         nullptr, nullptr, &err),
            SQLITE_OK)
      << err;
  sqlite3_close(db);
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->GetRecord("a", "t:old"), "1:s1");
  ASSERT_TRUE((*store)->PutSessionRecord("a", "s1", "t:new", "2:s1").ok());
  ASSERT_TRUE((*store)->Delete("a", "s1").ok());
  EXPECT_EQ((*store)->GetRecord("a", "t:new").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*(*store)->GetRecord("a", "t:old"), "1:s1") << "nobody's: kept its day";
}

// Which messages a prompt may hold: complete turns, system messages, the turn being asked.
TEST(CompleteTurnsTest, DropsTheTurnsThatAreNotComplete) {
  StoredMessage cut{"assistant", "Hal"};
  cut.state = TurnState::kInterrupted;
  StoredMessage failed{"assistant", ""};
  failed.state = TurnState::kFailed;
  const std::vector<StoredMessage> all = {{"system", "s"}, {"user", "a"}, {"assistant", "A"},
                                          {"user", "b"},   cut,           {"user", "c"},
                                          failed,          {"user", "d"}};
  std::vector<std::string> kept;
  for (const StoredMessage& m : CompleteTurns(all, 8)) kept.push_back(m.content);
  EXPECT_EQ(kept, (std::vector<std::string>{"s", "a", "A", "d"}));
  kept.clear();
  for (const StoredMessage& m : CompleteTurns(all, 4)) kept.push_back(m.content);
  EXPECT_EQ(kept, (std::vector<std::string>{"s", "a", "A", "b"})) << "b's reply is not in [0, 4)";
}

// The attempts a worker took back go, in order, on the model's kept reply they ran after (not
// on a reply the client wrote): those of the turns left out and those of the next kept reply
// (a resumed turn's earlier attempts).
TEST(CompleteTurnsTest, TakenBackAttemptsGoOnTheKeptReplyTheyRanAfter) {
  StoredMessage cut{"assistant", "Hal"};
  cut.state = TurnState::kInterrupted;
  cut.taken_back = {{{1}, 1}};
  StoredMessage failed{"assistant", ""};
  failed.state = TurnState::kFailed;
  failed.taken_back = {{{2}, 1}};
  StoredMessage resumed{"assistant", "B"};
  resumed.taken_back = {{{3}, 1}};
  StoredMessage first_cut{"assistant", "x"};  // before any kept reply: nowhere to go
  first_cut.state = TurnState::kInterrupted;
  first_cut.taken_back = {{{9}, 1}};
  StoredMessage model{"assistant", "A"};
  model.finish = 1;
  // The client's own part of a stopped reply (no finish: no record for a replay to follow).
  const StoredMessage written{"assistant", "Ha"};
  const std::vector<StoredMessage> all = {{"user", "z"}, first_cut, {"user", "a"}, model,
                                          {"user", "b"}, cut,       {"user", "c"}, failed,
                                          {"user", "d"}, written,   {"user", "e"}, resumed};
  const std::vector<StoredMessage> kept = CompleteTurns(all, 12);
  ASSERT_EQ(kept.size(), 6u);
  ASSERT_EQ(kept[1].content, "A");
  std::vector<int32_t> after;
  for (const TakenBackTurn& t : kept[1].taken_back_after) after.push_back(t.token_ids[0]);
  EXPECT_EQ(after, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(kept[3].taken_back_after.empty()) << "not on the client's part";
  EXPECT_TRUE(kept[5].taken_back_after.empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, SessionStoreTest, ::testing::Values("sqlite", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace recall::coordinator
