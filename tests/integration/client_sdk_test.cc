// The C++ SDK against `recall serve`-like processes (a coordinator and a worker): callback
// and iterator forms of a turn give the same reply, History, Close, and errors as statuses.
#include "client/client.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/serve_processes.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";

TEST(ClientSdkTest, CallbackAndIteratorRepliesHistoryAndClose) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address});
  auto a = client->StartSession({});
  auto b = client->StartSession({});
  ASSERT_TRUE(a.ok() && b.ok());
  for (auto* s : {&*a, &*b}) {
    (*s)->sampling().set_temperature(0);
    (*s)->sampling().set_max_tokens(30);
  }
  std::string by_callback;
  auto done = (*a)->Send("Once upon a time", [&](const std::string& t) { by_callback += t; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_GT(done->usage().generated_tokens(), 0);

  auto reply = (*b)->Stream("Once upon a time");
  std::string by_iterator, piece;
  while (reply->Next(&piece)) by_iterator += piece;
  ASSERT_TRUE(reply->status().ok()) << reply->status();
  EXPECT_EQ(by_iterator, by_callback);
  EXPECT_EQ(reply->done().usage().generated_tokens(), done->usage().generated_tokens());

  auto history = (*a)->History();
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 2u);
  EXPECT_EQ((*history)[1].content(), by_callback);
  ASSERT_TRUE((*a)->Close().ok());
  EXPECT_EQ((*a)->History().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Converse("s-missing", "hi", {}, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recall
