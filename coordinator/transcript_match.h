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
// the transcript the session now holds (by a hash of the tenant and its messages); a request
// whose list extends a recorded transcript continues that session. Several candidates are
// returned, longest first; the caller verifies each against the store (a hash is not proof).
// Bounded: the least recently used entries go first. In memory, per coordinator.
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

class TranscriptIndex {
 public:
  explicit TranscriptIndex(size_t capacity) : capacity_(capacity) {}

  // `tenant`'s session `id` now holds exactly `transcript` (replacing what it was said to hold).
  void Put(const std::string& tenant, const std::string& id,
           const std::vector<StoredMessage>& transcript);
  // The sessions whose recorded transcript may be a proper prefix of `messages` that ends
  // with an assistant message: (its length, the session id), longest first.
  std::vector<std::pair<int, std::string>> Find(const std::string& tenant,
                                                const std::vector<StoredMessage>& messages);
  size_t size();

 private:
  struct Entry {
    std::string id;
    int length = 0;
    std::list<uint64_t>::iterator lru;  // its place in lru_
  };

  const size_t capacity_;
  absl::Mutex mu_;
  std::unordered_map<uint64_t, Entry> by_hash_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> hash_of_ ABSL_GUARDED_BY(mu_);  // by session id
  std::list<uint64_t> lru_ ABSL_GUARDED_BY(mu_);                            // most recent first
};

}  // namespace recall::coordinator
