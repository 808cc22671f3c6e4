// TurnStream's listener: called once for every update the producer pushes (tokens, text, the
// end) and never after the end, without the stream's lock held (it may take the update);
// called at once when set with an update pending; a reader driven only by the listener gets
// every token once, in order, and the end once, while the producer runs on another thread.
#include "worker/serving/turn_stream.h"

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace recall::serving {
namespace {

TEST(TurnStreamTest, TheListenerIsCalledForEveryUpdateAndNotAfterTheEnd) {
  TurnStream stream;
  int calls = 0;
  stream.SetListener([&] { ++calls; });
  stream.PushToken(1, "a");
  EXPECT_EQ(calls, 1);
  stream.PushToken(2, "");
  EXPECT_EQ(calls, 2);
  stream.PushText("tail");
  EXPECT_EQ(calls, 3);
  stream.PushText("");  // adds nothing: no update
  EXPECT_EQ(calls, 3);
  stream.Finish(absl::OkStatus());
  EXPECT_EQ(calls, 4);
  // After the end, pushes are ignored and nobody is told.
  stream.PushToken(3, "x");
  stream.PushText("y");
  stream.Finish(absl::CancelledError("late"));
  EXPECT_EQ(calls, 4);
  // The four updates were coalesced (nobody took them) into one, with the end.
  TurnUpdate u;
  ASSERT_TRUE(stream.TryNext(&u));
  EXPECT_EQ(u.token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(u.text, "atail");
  EXPECT_TRUE(u.done);
  EXPECT_TRUE(u.status.ok());
  EXPECT_FALSE(stream.TryNext(&u));
}

TEST(TurnStreamTest, AListenerSetWithAnUpdatePendingIsCalledAtOnce) {
  TurnStream stream;
  stream.PushToken(7, "seven");
  int calls = 0;
  stream.SetListener([&] { ++calls; });
  EXPECT_EQ(calls, 1);
  TurnUpdate u;
  ASSERT_TRUE(stream.TryNext(&u));
  EXPECT_EQ(u.token_ids, (std::vector<int32_t>{7}));
  stream.Finish(absl::OkStatus());
  EXPECT_EQ(calls, 2);

  TurnStream idle;
  int idle_calls = 0;
  idle.SetListener([&] { ++idle_calls; });
  EXPECT_EQ(idle_calls, 0) << "nothing pending, nothing to tell";
}

TEST(TurnStreamTest, TheListenerMayTakeTheUpdateItIsToldAbout) {
  // The listener runs without the stream's lock: TryNext inside it must not deadlock, and
  // each call finds exactly the update it was called for.
  TurnStream stream;
  std::vector<TurnUpdate> taken;
  stream.SetListener([&] {
    TurnUpdate u;
    ASSERT_TRUE(stream.TryNext(&u));
    taken.push_back(std::move(u));
  });
  TokenLogprob lp{-0.5f, "one", {1, 4}, {-0.5f, -2.0f}, {"one", "four"}};
  stream.PushToken(1, "one", &lp);
  stream.PushText(" more");
  stream.Finish(absl::InvalidArgumentError("bad"));
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].token_ids, (std::vector<int32_t>{1}));
  ASSERT_EQ(taken[0].logprobs.size(), 1u);
  EXPECT_EQ(taken[0].logprobs[0].logprob, -0.5f);
  EXPECT_EQ(taken[0].logprobs[0].top_tokens, (std::vector<std::string>{"one", "four"}));
  EXPECT_EQ(taken[0].text, "one");
  EXPECT_TRUE(taken[1].token_ids.empty());
  EXPECT_EQ(taken[1].text, " more");
  EXPECT_TRUE(taken[2].done);
  EXPECT_EQ(taken[2].status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(TurnStreamTest, AReaderWokenOnlyByTheListenerGetsEveryTokenOnceInOrder) {
  // As the worker's reactor does: the listener (on the producer's thread) only says that an
  // update is ready, and the reader takes updates on its own thread, never waiting with a
  // timeout. No wake-up may be lost: the reader gets every token once, in order, and the end.
  constexpr int kTokens = 5000;
  TurnStream stream;
  absl::Mutex mu;
  int signals = 0;  // listener calls
  stream.SetListener([&] {
    absl::MutexLock lock(&mu);
    ++signals;
  });
  std::vector<int32_t> got;
  int ends = 0;
  std::thread reader([&] {
    int seen = 0;
    while (ends == 0) {
      {
        absl::MutexLock lock(&mu);
        auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return signals > seen; };
        mu.Await(absl::Condition(&woken));
        seen = signals;
      }
      TurnUpdate u;
      while (stream.TryNext(&u)) {
        got.insert(got.end(), u.token_ids.begin(), u.token_ids.end());
        ends += u.done ? 1 : 0;
      }
    }
  });
  for (int i = 0; i < kTokens; ++i) stream.PushToken(i, "");
  stream.Finish(absl::OkStatus());
  reader.join();
  EXPECT_EQ(ends, 1);
  ASSERT_EQ(got.size(), static_cast<size_t>(kTokens));
  for (int i = 0; i < kTokens; ++i) ASSERT_EQ(got[i], i);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(signals, kTokens + 1) << "one call per token and one for the end";
}

}  // namespace
}  // namespace recall::serving
