// TurnStream: the channel between the engine thread, which produces a turn's tokens, and
// whoever sends them to the client.
//
// The engine never waits on the reader: Push only appends under a mutex. The reader takes
// everything pending at once, so when it is behind (a slow network or client), pending
// tokens are coalesced into one update instead of stalling the batch.
//
// Two ways to read: Next waits (with a timeout) on the calling thread, for in-process
// callers (tests, CollectTurn); or a listener (SetListener) is told when an update is ready
// and the reader takes it with TryNext when it can send it, so no thread waits (the
// worker's gRPC reactor does this).
//
// Thread safety: one producer (the engine thread) and one reader; every method is safe to
// call concurrently with the others.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace recall::serving {

enum class TurnFinish { kLength, kStop, kContext };
const char* TurnFinishName(TurnFinish finish);

// What a turn of a session that evicts fed before it was taken back (Scheduler::TakeBack,
// TakeBackFinished): its prompt's tokens, fed as prefill chunks, then its reply's, one per
// decode step. A rebuild feeds them and gives them back alike (replay.h).
struct TakenBackTurn {
  std::vector<int32_t> token_ids;
  int prompt_tokens = 0;
};

struct TurnSummary {
  TurnFinish finish = TurnFinish::kLength;
  int prompt_tokens = 0;  // context before generation (cached + new)
  int cached_tokens = 0;  // reused from the resident cache
  int generated_tokens = 0;
  int64_t kv_bytes = 0;     // held after the turn: KV and the policy's per-slot state
  int64_t state_bytes = 0;  // of kv_bytes: the eviction policy's per-slot state
  int64_t held_tokens = 0;  // slots of the largest (layer, KV head) cache after the turn
  int64_t peak_kv_bytes = 0;
  int64_t evictions = 0;
  int64_t evicted_tokens = 0;
  bool rebuilt = false;  // the cache was (re)built from the transcript
  // Policy "episodic": windows in each of the session's episodes (empty until they are
  // built), the episode that served this turn (-1: none yet), and the tokens fed again to
  // bring that episode's cache up to date.
  std::vector<int> episode_windows;
  int episode = -1;
  int replayed_tokens = 0;
  std::string text;  // the whole reply
};

// A sampled token's log probability under the model's distribution (before temperature and
// the other sampling transforms), its bytes in the reply (UTF-8 may be split over tokens),
// and the most likely tokens at its place, most likely first (TurnRequest.top_logprobs).
struct TokenLogprob {
  float logprob = 0;
  std::string token;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::vector<std::string> top_tokens;
};

struct TurnUpdate {
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // one per token when requested
  std::string text;
  bool done = false;  // then `status` and (if ok) `summary` are final
  absl::Status status;
  TurnSummary summary;
};

class TurnStream {
 public:
  // ---- Engine side.
  // A sampled token with the text it releases (possibly empty), in one update so a reader
  // that keeps up gets one message per token. logprob: when requested (moved from).
  void PushToken(int32_t id, std::string_view text, TokenLogprob* logprob = nullptr);
  void PushText(std::string_view text);
  // The end: an error status, or OK with the summary. Later pushes are ignored.
  void Finish(absl::Status status, TurnSummary summary = {});

  // ---- Reader side.
  // Waits up to `timeout` for pending tokens/text or the end; moves them into *out
  // (cleared first). Returns false when nothing came. After the update with done = true,
  // returns false forever.
  bool Next(absl::Duration timeout, TurnUpdate* out);
  // Next without waiting: takes what is pending, if anything.
  bool TryNext(TurnUpdate* out) { return Next(absl::ZeroDuration(), out); }

  // `listener` is called after every push that adds to the pending update (each PushToken,
  // each non-empty PushText, and Finish), on the producer's thread and without the stream's
  // lock held, so it may call TryNext; it is never called after the call for Finish. If an
  // update is already pending when it is set, it is also called once from SetListener, on
  // this thread (that call may overlap one from the producer). It must not block, since it
  // runs on the engine thread: a reader takes the update with TryNext, or notes that one is
  // ready and takes it when it can send it.
  // REQUIRES: called at most once.
  void SetListener(std::function<void()> listener);

 private:
  bool HasPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Set once, then called without the lock by whoever saw has_listener_ true under it.
  std::function<void()> listener_;
  bool has_listener_ ABSL_GUARDED_BY(mu_) = false;
  TurnUpdate pending_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool delivered_end_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace recall::serving
