// Clients that send the whole conversation with every request (the OpenAI way), matched to
// stored sessions so the workers' caches are reused.
//
// MatchTranscript: a named session's stored transcript against the client's message list.
// When the list extends the transcript, the turn adds only the messages after it (the worker
// continues its cache). When it diverges (an edited or regenerated message, another system
// prompt), the session is rebuilt in place: the transcript keeps the longest common prefix,
// the rest of the list is the turn's new messages, and the worker rebuilds its cache from the
// history. The session id stays the same, so a client that names it on every request keeps
// hitting one session; forking a new session instead would hand such a client a new id (and a
// cold cache) after every divergence. Messages are equal when role and content are equal
// byte for byte.
//
// TranscriptIndex: for clients that name no session. After each turn the HTTP edge records
// the transcript the session now holds (by a SHA-256 chain over the tenant and its messages);
// a request whose list extends a recorded transcript continues that session. Several
// candidates are returned, longest first; the caller verifies each against the store (a
// digest is not proof). Records are written through to the session store (named records
// "t:DIGEST" of the session, kept a day or until the session is deleted), so a plain OpenAI client
// keeps its session and warm cache when its next request reaches another coordinator sharing the
// store, or this one after a restart; a bounded memory copy (least recently used first out) answers
// without a store read, and the store is asked for at most the kStoreLookups longest prefixes
// longer than the longest the memory knows.
//
// Thread safety: MatchTranscript is pure; TranscriptIndex is thread safe.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/conversations.h"
#include "coordinator/session_store.h"

namespace recall::coordinator {

// The turn that brings `stored` to `request` (see the top). REQUIRES: `request` is not
// empty. The turn adds at least the last message of `request`.
TurnMessages MatchTranscript(const std::vector<StoredMessage>& stored,
                             const std::vector<StoredMessage>& request);

// Whether stored[from...] is only `request`'s own stopped turn: no complete reply (replies
// interrupted or failed only; or the session's last reply complete, when the request holds
// a proper prefix of it and goes on: its client stopped reading it), and every other message
// there is the request's message at the same place, without a turn id (a keyed turn stays
// resumable by its key). A session that went on from there only by the turn its client
// stopped and now sends again; another conversation that shares the session's opening does
// not take it over.
bool OnlyStoppedTurnsOfTheListFrom(const std::vector<StoredMessage>& stored,
                                   const std::vector<StoredMessage>& request, int from);

// `request` with the token ids and ends `stored` kept for the replies they share (the same
// messages from the first on, complete): a new session made from the list replays those
// replies as the model gave them. Tokenized anew, a reply's text can give other tokens, and
// the next reply then another text (the same list answered differently on a fresh session).
std::vector<StoredMessage> WithReplyTokens(std::vector<StoredMessage> request,
                                           const std::vector<StoredMessage>& stored);

class TranscriptIndex {
 public:
  static constexpr int kStoreLookups = 4;
  // `store` (may be null: memory only) must outlive this.
  TranscriptIndex(size_t capacity, SessionStore* store) : capacity_(capacity), store_(store) {}

  // `tenant`'s session `id` now holds exactly `transcript` (replacing what it was said to hold).
  void Put(const std::string& tenant, const std::string& id,
           const std::vector<StoredMessage>& transcript);
  // `tenant`'s session `id` holds a conversation's first exchange, whose opening (its system
  // messages and the user's first message) is `opening`: a list that goes on from that opening
  // with the reply cut short (OnlyStoppedTurnsOfTheListFrom) finds the session by it, which no
  // earlier transcript can do. In the store only (the memory keeps a session's last one).
  void PutOpening(const std::string& tenant, const std::string& id,
                  const std::vector<StoredMessage>& opening);
  // The sessions whose recorded transcript may be a proper prefix of `messages` that ends
  // with an assistant message, or whose opening (PutOpening) is the list's, followed there by
  // an assistant message: (its length, the session id), longest first.
  std::vector<std::pair<int, std::string>> Find(const std::string& tenant,
                                                const std::vector<StoredMessage>& messages);
  size_t size();

 private:
  struct Entry {
    std::string id;
    int length = 0;
    std::list<std::string>::iterator lru;  // its place in lru_
  };
  void Remember(const std::string& digest, const std::string& id, int length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the store's record of `digest` (a `what`, "transcript" or "opening", of session
  // `id`, `length` messages); a failure is logged, as the index is a hint.
  void Record(const std::string& tenant, const std::string& digest, int length,
              const std::string& id, const char* what);

  const size_t capacity_;
  SessionStore* const store_;
  absl::Mutex mu_;
  std::unordered_map<std::string, Entry> by_digest_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> digest_of_ ABSL_GUARDED_BY(mu_);  // by session
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // digests, most recent first
};

}  // namespace recall::coordinator
