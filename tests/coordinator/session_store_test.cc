// The SessionStore contract, run against SQLite (a file) and a real redis-server.
#include "coordinator/session_store.h"

#include <signal.h>
#include <sys/wait.h>

#include "gtest/gtest.h"
#include "tests/common/redis_server.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

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

TEST_P(SessionStoreTest, DataSurvivesReopening) {
  ASSERT_TRUE(store_->Create(Record("s1", "a")).ok());
  ASSERT_TRUE(store_->Append("a", "s1", 0, {"user", "kept"}).ok());
  store_.reset();
  auto again = OpenStore(url_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Get("a", "s1")->messages.at(0).content, "kept");
}

INSTANTIATE_TEST_SUITE_P(Backends, SessionStoreTest, ::testing::Values("sqlite", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace recall::coordinator
