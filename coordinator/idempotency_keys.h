// IdempotencyKeys: the HTTP API's memory of its Idempotency-Key headers (http_api.h). A key is
// a turn id (turn_ids.h) that the turn's user message stores; for requests that name no
// session, this map says which session a key's turn went to (and for /v1/completions, which
// has no session, what the request gave), and which keys have a request
// running now, so a request sent again while the first still runs is told to wait instead of
// starting the turn twice. Bounded (the oldest keys go first), in memory, per coordinator: a
// request that names its session (X-Session-Id) finds its key in the store, across restarts.
//
// Thread safety: thread safe.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/session_store.h"

namespace recall::coordinator {

class IdempotencyKeys {
 public:
  explicit IdempotencyKeys(size_t capacity) : capacity_(capacity) {}

  // Marks `tenant`'s `key` as having a request running; false when one already runs.
  bool Claim(const std::string& tenant, const std::string& key);
  void Release(const std::string& tenant, const std::string& key);

  // `tenant`'s `key` ran its turn in session `session_id`.
  void Put(const std::string& tenant, const std::string& key, const std::string& session_id);
  // The session `tenant`'s `key` ran in, or "" when none is known.
  std::string Find(const std::string& tenant, const std::string& key);

  // /v1/completions, whose requests no session keeps: what a key's request gave, the prompt
  // and model it was for, and its reply as far as it went (kComplete, or kInterrupted with
  // the part that was sent, possibly none), with the seed it sampled with. Bounded by the
  // key count and by kCompletionBytes of prompts and replies (the oldest go first).
  struct Completion {
    std::string prompt;
    std::string model;
    StoredMessage reply;
  };
  static constexpr size_t kCompletionBytes = 64 << 20;
  void PutCompletion(const std::string& tenant, const std::string& key, Completion completion);
  std::optional<Completion> FindCompletion(const std::string& tenant, const std::string& key);

 private:
  static std::string Of(const std::string& tenant, const std::string& key);

  const size_t capacity_;
  absl::Mutex mu_;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> session_of_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // session_of_'s keys, oldest first
  std::unordered_map<std::string, Completion> completions_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> completion_order_ ABSL_GUARDED_BY(mu_);
  size_t completion_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recall::coordinator
