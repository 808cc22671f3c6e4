// IdempotencyKeys: the HTTP API's memory of its Idempotency-Key headers (http_api.h). A key is
// a turn id (turn_ids.h) that the turn's user message stores; for requests that name no
// session, this says which session a key's turn went to (and for /v1/completions, which has
// no session, what the request gave), and which keys have a request running now, so a
// request sent again while the first still runs is told to wait instead of starting the turn
// twice. What a key's request gave is written through to the session store (a chat turn's
// session as a record of that session, SessionStore::PutSessionRecord, kept a day or until
// the session is deleted; a completion's SessionStore::PutRecord, kept a day), so a retry finds it
// on any coordinator sharing the store and after a restart. A bounded in-memory copy (the oldest go
// first) saves the store a read for a key's session, which changes only when that session is
// deleted (Forget); a completion's record, which does, is read from the store, the copy answering
// only when there is no store or it fails. The running marks are per coordinator; other
// coordinators see a running request in the store: a chat turn as its stored turn in progress, a
// keyed completion as its record in progress, under a lease its coordinator renews (http_api.cc). A
// request that names its session (X-Session-Id) finds its key in the session's transcript.
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
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/session_store.h"

namespace recall::coordinator {

class IdempotencyKeys {
 public:
  // `store` (may be null: memory only) must outlive this.
  IdempotencyKeys(size_t capacity, SessionStore* store) : capacity_(capacity), store_(store) {}

  // Marks `tenant`'s `key` as having a request running; false when one already runs. One
  // whose client left (Ending) is waited for (at most kEndingWait): a client that stopped a
  // reply and sent it again with its key at once gets it, not a 409.
  bool Claim(const std::string& tenant, const std::string& key);
  void Release(const std::string& tenant, const std::string& key);
  // The request running with `key` lost its client: it ends as soon as its turn lets go.
  void Ending(const std::string& tenant, const std::string& key);
  static constexpr absl::Duration kEndingWait = absl::Seconds(10);

  // `tenant`'s `key` ran its turn in session `session_id`. A store that fails to keep it is
  // logged (a retry may then run the turn again), not an error of the request.
  void Put(const std::string& tenant, const std::string& key, const std::string& session_id);
  // The session `tenant`'s `key` ran in, or "" when none is known.
  std::string Find(const std::string& tenant, const std::string& key);
  // `tenant`'s `key` no longer names session `session_id` (deleted since): its record is
  // forgotten while it names it, so the key is free again (Add claims it anew).
  void Forget(const std::string& tenant, const std::string& key, const std::string& session_id);
  // Put for a key no request had when it was looked for (Find said ""): AlreadyExists when
  // a request with the key on another coordinator recorded another session since (both ran
  // at once); InvalidArgument when the key is a completion's (OtherRequest); the store's
  // failure is logged, as Put's.
  absl::Status Add(const std::string& tenant, const std::string& key,
                   const std::string& session_id);

  // /v1/completions, whose requests no session keeps: what a key's request gave, the digest
  // of the prompt (Digest) and the model it was for, and its reply as far as it went
  // (kComplete, or kInterrupted with the part that was sent, possibly none; kInProgress while
  // a coordinator runs it, with reply.lease_unix_ms, the time until which it vouches for it),
  // with the seed it samples with. The memory copy is bounded by the key count and by
  // kCompletionBytes of replies (the oldest go first).
  struct Completion {
    std::string prompt_digest;
    std::string model;
    StoredMessage reply;
  };
  // SHA-256 of `prompt`, as 64 hex digits.
  static std::string Digest(const std::string& prompt);
  // A completion as a store record's bytes, and back (nullopt for bytes that are not one).
  static std::string EncodeCompletion(const Completion& c);
  static std::optional<Completion> DecodeCompletion(const std::string& bytes);
  static constexpr size_t kCompletionBytes = 64 << 20;
  void PutCompletion(const std::string& tenant, const std::string& key, Completion completion);
  // PutCompletion for a key no request had (FindCompletion said none), or in place of the
  // stored record `was` (FindCompletion's *record: a completion to resume): AlreadyExists when
  // a request with the key on another coordinator recorded one since (both took it at once);
  // InvalidArgument when the key is a chat's (OtherRequest).
  absl::Status AddCompletion(const std::string& tenant, const std::string& key,
                             Completion completion, const std::string& was = "");
  // With `record`, the stored bytes it was read from ("" when it came from memory).
  std::optional<Completion> FindCompletion(const std::string& tenant, const std::string& key,
                                           std::string* record = nullptr);

 private:
  static std::string Of(const std::string& tenant, const std::string& key);
  // InvalidArgument naming the header: the key was sent with a request to `endpoint` (a chat
  // and a completion share the key's record: one put over the other ran its retry again).
  static absl::Status OtherRequest(const std::string& key, const char* endpoint);

  void Remember(const std::string& k, const std::string& session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberCompletion(const std::string& k, Completion completion)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  SessionStore* const store_;
  absl::Mutex mu_;
  std::set<std::string> running_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> ending_ ABSL_GUARDED_BY(mu_);  // of running_, those whose client left
  std::unordered_map<std::string, std::string> session_of_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // session_of_'s keys, oldest first
  std::unordered_map<std::string, Completion> completions_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> completion_order_ ABSL_GUARDED_BY(mu_);
  size_t completion_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recall::coordinator
