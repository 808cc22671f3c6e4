#include "coordinator/transcript_match.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "coordinator/digest.h"

namespace recall::coordinator {
namespace {

// A stored turn that is not complete never matches: the client's message takes its place.
bool Same(const StoredMessage& a, const StoredMessage& b) {
  return a.role == b.role && a.content == b.content && a.state == TurnState::kComplete &&
         b.state == TurnState::kComplete;
}

// The digest of a transcript, message by message: the tenant, then each message's role and
// content as length-prefixed fields, so every coordinator computes the same.
Sha256 Start(const std::string& tenant) {
  Sha256 chain;
  chain.AddField("recall transcript").AddField(tenant);
  return chain;
}
void Next(Sha256& chain, const StoredMessage& m) { chain.AddField(m.role).AddField(m.content); }

// Whether the request holds a proper prefix of stored[i], the session's last reply, and goes
// on past it: its client stopped reading the reply, which the coordinator may have written
// whole into the connection's buffers before the client hung up (so it completed).
bool CutShort(const std::vector<StoredMessage>& stored, const std::vector<StoredMessage>& request,
              size_t i) {
  return i + 1 == stored.size() && i + 1 < request.size() && request[i].role == "assistant" &&
         stored[i].state == TurnState::kComplete && !request[i].content.empty() &&
         request[i].content.size() < stored[i].content.size() &&
         absl::StartsWith(stored[i].content, request[i].content);
}

// The store record of a transcript's digest (SessionStore::PutRecord's names).
std::string RecordName(const std::string& digest) { return "t:" + Hex(digest); }

}  // namespace

TurnMessages MatchTranscript(const std::vector<StoredMessage>& stored,
                             const std::vector<StoredMessage>& request) {
  RECALL_CHECK(!request.empty()) << "MatchTranscript of an empty message list";
  size_t common = 0;
  while (common < stored.size() && common < request.size() &&
         Same(stored[common], request[common])) {
    ++common;
  }
  // The turn adds at least the last message: a list that the transcript already contains
  // (a regenerated reply) rebuilds from the message before it.
  const size_t keep = std::min(common, request.size() - 1);
  TurnMessages out;
  out.keep = static_cast<int>(keep);
  out.add.assign(request.begin() + static_cast<std::ptrdiff_t>(keep), request.end());
  return out;
}

bool OnlyStoppedTurnsOfTheListFrom(const std::vector<StoredMessage>& stored,
                                   const std::vector<StoredMessage>& request, int from) {
  for (size_t i = static_cast<size_t>(std::max(from, 0)); i < stored.size(); ++i) {
    const StoredMessage& m = stored[i];
    if (m.role == "assistant") {
      if (m.state != TurnState::kInterrupted && m.state != TurnState::kFailed &&
          !CutShort(stored, request, i)) {
        return false;
      }
    } else if (i >= request.size() || request[i].role != m.role ||
               request[i].content != m.content || !m.turn_id.empty()) {
      return false;
    }
  }
  return true;
}

std::vector<StoredMessage> WithReplyTokens(std::vector<StoredMessage> request,
                                           const std::vector<StoredMessage>& stored) {
  for (size_t i = 0; i < request.size() && i < stored.size() && Same(stored[i], request[i]); ++i) {
    if (stored[i].role == "assistant" && request[i].token_ids.empty()) {
      request[i].token_ids = stored[i].token_ids;
      request[i].finish = stored[i].finish;
    }
  }
  return request;
}

void TranscriptIndex::Remember(const std::string& digest, const std::string& id, int length) {
  if (auto old = digest_of_.find(id); old != digest_of_.end()) {
    auto e = by_digest_.find(old->second);
    if (e != by_digest_.end() && e->second.id == id) {
      lru_.erase(e->second.lru);
      by_digest_.erase(e);
    }
    digest_of_.erase(old);
  }
  if (auto taken = by_digest_.find(digest); taken != by_digest_.end()) {
    // Another session of the same tenant holds the same transcript: the newer one wins.
    digest_of_.erase(taken->second.id);
    lru_.erase(taken->second.lru);
    by_digest_.erase(taken);
  }
  lru_.push_front(digest);
  by_digest_[digest] = Entry{id, length, lru_.begin()};
  digest_of_[id] = digest;
  while (by_digest_.size() > capacity_) {
    auto e = by_digest_.find(lru_.back());
    lru_.pop_back();
    digest_of_.erase(e->second.id);
    by_digest_.erase(e);
  }
}

void TranscriptIndex::Put(const std::string& tenant, const std::string& id,
                          const std::vector<StoredMessage>& transcript) {
  Sha256 chain = Start(tenant);
  for (const StoredMessage& m : transcript) Next(chain, m);
  const std::string digest = chain.Digest();
  const int length = static_cast<int>(transcript.size());
  {
    absl::MutexLock lock(&mu_);
    Remember(digest, id, length);
  }
  Record(tenant, digest, length, id, "transcript");
}

void TranscriptIndex::Record(const std::string& tenant, const std::string& digest, int length,
                             const std::string& id, const char* what) {
  if (store_ == nullptr) return;
  if (absl::Status st =
          store_->PutSessionRecord(tenant, id, RecordName(digest), absl::StrCat(length, ":", id));
      !st.ok() && !absl::IsNotFound(st)) {  // NotFound: the session was deleted since
    RECALL_LOG(WARNING) << "the " << what << " of session " << QuotedId(id)
                        << " is not in the store's index (its next request may start a new "
                           "session elsewhere): "
                        << st;
  }
}

void TranscriptIndex::PutOpening(const std::string& tenant, const std::string& id,
                                 const std::vector<StoredMessage>& opening) {
  if (store_ == nullptr) return;
  Sha256 chain = Start(tenant);
  for (const StoredMessage& m : opening) Next(chain, m);
  Record(tenant, chain.Digest(), static_cast<int>(opening.size()), id, "opening");
}

std::vector<std::pair<int, std::string>> TranscriptIndex::Find(
    const std::string& tenant, const std::vector<StoredMessage>& messages) {
  // prefix[n]: the digest of messages[0, n), for the lengths that may match (a proper prefix
  // ending with an assistant message, or the opening: system messages and the first user
  // message, an assistant message after it).
  std::vector<std::string> prefix(messages.size());
  Sha256 chain = Start(tenant);
  bool opening = true;  // messages[0, n) are system messages, then at most one user message
  for (size_t n = 1; n < messages.size(); ++n) {
    Next(chain, messages[n - 1]);
    const std::string& role = messages[n - 1].role;
    if (role == "assistant" || (opening && role == "user" && messages[n].role == "assistant")) {
      prefix[n] = chain.Digest();
    }
    opening = opening && role == "system";
  }
  std::vector<std::pair<int, std::string>> out;
  std::vector<int> unknown;  // lengths the memory does not know, longest first
  {
    absl::MutexLock lock(&mu_);
    for (size_t n = prefix.size(); n-- > 1;) {
      if (prefix[n].empty()) continue;
      auto e = by_digest_.find(prefix[n]);
      if (e == by_digest_.end() || e->second.length != static_cast<int>(n)) {
        unknown.push_back(static_cast<int>(n));
        continue;
      }
      lru_.splice(lru_.begin(), lru_, e->second.lru);  // used: most recent
      out.emplace_back(static_cast<int>(n), e->second.id);
    }
  }
  if (store_ == nullptr) return out;
  // Only prefixes longer than the memory's longest are asked of the store: the longest
  // candidate is the one a request continues, and each lookup is a store read.
  const int longest = out.empty() ? 0 : out.front().first;
  for (size_t i = 0; i < unknown.size() && i < static_cast<size_t>(kStoreLookups); ++i) {
    const int n = unknown[i];
    if (n < longest) break;
    absl::StatusOr<std::string> rec = store_->GetRecord(tenant, RecordName(prefix[n]));
    if (!rec.ok()) {
      if (!absl::IsNotFound(rec.status())) {
        RECALL_LOG(WARNING) << "transcript index: " << rec.status();
        break;  // the store is not answering: no more lookups for this request
      }
      continue;
    }
    const size_t colon = rec->find(':');
    int length = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(rec->substr(0, colon), &length) ||
        length != n) {
      continue;  // not a record of this prefix
    }
    const std::string id = rec->substr(colon + 1);
    {
      absl::MutexLock lock(&mu_);
      Remember(prefix[n], id, n);
    }
    out.emplace_back(n, id);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

size_t TranscriptIndex::size() {
  absl::MutexLock lock(&mu_);
  return by_digest_.size();
}

}  // namespace recall::coordinator
