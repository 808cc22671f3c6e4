// IdempotencyKeys (coordinator/idempotency_keys.h) over a real SQLite store: what one instance
// puts, another over the same store finds (another coordinator, or this one after a restart);
// a completion's record round-trips, and damaged records read as absent, never a crash.
#include "coordinator/idempotency_keys.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

IdempotencyKeys::Completion SomeCompletion() {
  IdempotencyKeys::Completion c;
  c.prompt_digest = IdempotencyKeys::Digest("Once upon a time");
  c.model = "stories";
  c.reply.role = "assistant";
  c.reply.content = std::string("there was\0 a cat:", 18);
  c.reply.token_ids = {5, 0, -1, 511};
  c.reply.finish = 2;
  c.reply.seed = 0xfedcba9876543210ULL;
  c.reply.state = TurnState::kInterrupted;
  c.reply.lease_unix_ms = 1234;
  return c;
}

// Sessions "session-1".."session-5" of tenants "a" and "b" in `store`: a chat key's record is
// a record of its session.
void MakeSessions(SessionStore& store) {
  for (const char* tenant : {"a", "b"}) {
    for (int i = 1; i <= 5; ++i) {
      SessionRecord r;
      r.id = absl::StrCat("session-", i, tenant == std::string("a") ? "" : "b");
      r.tenant = tenant;
      r.model = "m";
      ASSERT_TRUE(store.Create(r).ok()) << r.id;
    }
  }
}

TEST(IdempotencyKeysTest, WhatOneCoordinatorPutsAnotherFindsInTheStore) {
  const std::string path = testing::MakeTempDir("idempotency") + "/sessions.db";
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  MakeSessions(**store);
  IdempotencyKeys first(16, store->get());
  first.Put("a", "k1", "session-1");
  first.PutCompletion("a", "k2", SomeCompletion());

  IdempotencyKeys second(16, store->get());  // another coordinator, or after a restart
  EXPECT_EQ(second.Find("a", "k1"), "session-1");
  EXPECT_EQ(second.Find("b", "k1"), "") << "another tenant's key";
  EXPECT_EQ(second.Find("a", "k2"), "") << "a completion's key names no session";
  EXPECT_FALSE(second.FindCompletion("a", "k1").has_value());
  std::optional<IdempotencyKeys::Completion> c = second.FindCompletion("a", "k2");
  ASSERT_TRUE(c.has_value());
  const IdempotencyKeys::Completion want = SomeCompletion();
  EXPECT_EQ(c->prompt_digest, want.prompt_digest);
  EXPECT_EQ(c->model, want.model);
  EXPECT_EQ(c->reply.content, want.reply.content);
  EXPECT_EQ(c->reply.token_ids, want.reply.token_ids);
  EXPECT_EQ(c->reply.finish, want.reply.finish);
  EXPECT_EQ(c->reply.seed, want.reply.seed);
  EXPECT_EQ(c->reply.state, want.reply.state);
  EXPECT_EQ(c->reply.lease_unix_ms, want.reply.lease_unix_ms);

  IdempotencyKeys memory_only(16, nullptr);
  EXPECT_EQ(memory_only.Find("a", "k1"), "");
}

// A key two coordinators took at once (neither found it): the first to add its session or
// completion keeps it, the second is told (AlreadyExists) and takes its turn back; adding
// the session the key holds already is no conflict.
TEST(IdempotencyKeysTest, OfTwoCoordinatorsAddingOneKeyTheFirstKeepsIt) {
  const std::string path = testing::MakeTempDir("idempotency_add") + "/sessions.db";
  auto store = OpenStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  MakeSessions(**store);
  IdempotencyKeys first(16, store->get()), second(16, store->get());
  EXPECT_EQ(first.Find("a", "k1"), "");
  EXPECT_EQ(second.Find("a", "k1"), "");
  ASSERT_TRUE(first.Add("a", "k1", "session-1").ok());
  EXPECT_EQ(second.Add("a", "k1", "session-2").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(second.Find("a", "k1"), "session-1");
  EXPECT_TRUE(second.Add("a", "k1", "session-1").ok());
  EXPECT_TRUE(second.Add("b", "k1", "session-3b").ok()) << "another tenant's key";

  ASSERT_TRUE(first.AddCompletion("a", "k2", SomeCompletion()).ok());
  EXPECT_EQ(second.AddCompletion("a", "k2", SomeCompletion()).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(second.FindCompletion("a", "k2").has_value());
  // A key of the other kind of request is refused naming it (it got 409 until the record's
  // day passed; then, put over, the other request's retry ran again); a damaged record is put
  // over.
  IdempotencyKeys third(16, store->get());
  const absl::Status chat = third.Add("a", "k2", "session-4");
  EXPECT_EQ(chat.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chat.message(),
            "Idempotency-Key: \"k2\" was sent with a /v1/completions request; a new request needs "
            "a new key");
  EXPECT_EQ(third.AddCompletion("a", "k1", SomeCompletion()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IdempotencyKeys(16, store->get()).FindCompletion("a", "k2").has_value()) << "kept";
  ASSERT_TRUE((*store)->PutRecord("a", "k:k3", "c\x01garbage").ok());
  EXPECT_TRUE(third.Add("a", "k3", "session-5").ok()) << "over a damaged record";
  EXPECT_EQ(IdempotencyKeys(16, store->get()).Find("a", "k3"), "session-5");
  // A completion to resume (its coordinator gone) taken over by two at once: one gets it.
  std::string was_first, was_second;
  ASSERT_TRUE(first.FindCompletion("a", "k2", &was_first).has_value());
  ASSERT_TRUE(second.FindCompletion("a", "k2", &was_second).has_value());
  ASSERT_FALSE(was_first.empty());
  IdempotencyKeys::Completion resumed = SomeCompletion();
  resumed.reply.state = TurnState::kInProgress;
  EXPECT_TRUE(first.AddCompletion("a", "k2", resumed, was_first).ok());
  EXPECT_EQ(second.AddCompletion("a", "k2", resumed, was_second).code(),
            absl::StatusCode::kAlreadyExists);
}

// A key's request running is refused to a second at once; one whose client left (Ending) is
// waited for, and the second gets the key when the first lets it go.
// A chat key's record goes with its session: once the session is deleted the key is free on
// every coordinator, claimed again by one of two that add it at once. One whose memory still
// names the deleted session forgets it (Forget) and finds what the store says since.
TEST(IdempotencyKeysTest, AKeyOfADeletedSessionIsFreeAgain) {
  auto store = OpenStore(testing::MakeTempDir("idempotency_gone") + "/sessions.db");
  ASSERT_TRUE(store.ok()) << store.status();
  MakeSessions(**store);
  IdempotencyKeys first(16, store->get()), second(16, store->get());
  first.Put("a", "k1", "session-1");
  EXPECT_EQ(second.Find("a", "k1"), "session-1");
  ASSERT_TRUE((*store)->Delete("a", "session-1").ok());
  EXPECT_EQ(IdempotencyKeys(16, store->get()).Find("a", "k1"), "") << "its record went with it";
  EXPECT_EQ(first.Find("a", "k1"), "session-1") << "the memory still names it";
  first.Forget("a", "k1", "session-1");
  EXPECT_EQ(first.Find("a", "k1"), "");
  ASSERT_TRUE(second.Add("a", "k1", "session-2").ok()) << "claimed anew";
  second.Forget("a", "k1", "session-1");  // names another session now: kept
  EXPECT_EQ(second.Find("a", "k1"), "session-2");
  EXPECT_EQ(first.Add("a", "k1", "session-3").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(first.Find("a", "k1"), "session-2") << "read from the store, not the forgotten copy";
  // A record a coordinator from before session records wrote (no session of its own) is let
  // go by Forget while it names the deleted session.
  ASSERT_TRUE((*store)->PutRecord("a", "k:k2", "ssession-gone").ok());
  EXPECT_EQ(first.Add("a", "k2", "session-4").code(), absl::StatusCode::kAlreadyExists);
  first.Forget("a", "k2", "session-gone");
  EXPECT_TRUE(first.Add("a", "k2", "session-4").ok());
  EXPECT_EQ(IdempotencyKeys(16, store->get()).Find("a", "k2"), "session-4");
}

TEST(IdempotencyKeysTest, ARequestWhoseClientLeftIsWaitedFor) {
  IdempotencyKeys keys(16, nullptr);
  ASSERT_TRUE(keys.Claim("t", "k"));
  EXPECT_FALSE(keys.Claim("t", "k")) << "running";
  EXPECT_TRUE(keys.Claim("u", "k")) << "another tenant's";
  keys.Ending("t", "k");
  std::thread first([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    keys.Release("t", "k");
  });
  const absl::Time start = absl::Now();
  EXPECT_TRUE(keys.Claim("t", "k")) << "waited for the ending one";
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  first.join();
  EXPECT_FALSE(keys.Claim("t", "k")) << "the second holds it now, and is not ending";
}

TEST(IdempotencyKeysTest, DigestIsSha256InHex) {
  EXPECT_EQ(IdempotencyKeys::Digest(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(IdempotencyKeys::Digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(IdempotencyKeysTest, DamagedCompletionRecordsReadAsAbsent) {
  const std::string good = IdempotencyKeys::EncodeCompletion(SomeCompletion());
  ASSERT_TRUE(IdempotencyKeys::DecodeCompletion(good).has_value());
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(IdempotencyKeys::DecodeCompletion(good.substr(0, n)).has_value()) << n;
  }
  EXPECT_FALSE(IdempotencyKeys::DecodeCompletion(good + "x").has_value());
  EXPECT_FALSE(IdempotencyKeys::DecodeCompletion("c99999999999999999999:x").has_value());
  EXPECT_FALSE(IdempotencyKeys::DecodeCompletion("c-1:x").has_value());
  // The last two fields: the state (kInterrupted, 2) and the lease (1234).
  ASSERT_EQ(good.substr(good.size() - 9), "1:24:1234");
  std::string bad_state = good;
  bad_state[bad_state.size() - 7] = '7';
  EXPECT_FALSE(IdempotencyKeys::DecodeCompletion(bad_state).has_value());
  std::string bad_lease = good;
  bad_lease[bad_lease.size() - 1] = 'x';
  EXPECT_FALSE(IdempotencyKeys::DecodeCompletion(bad_lease).has_value());
}

}  // namespace
}  // namespace recall::coordinator
