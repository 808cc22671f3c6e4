#include "coordinator/transcript_match.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"

namespace recall::coordinator {
namespace {

// A stored turn that is not complete never matches: the client's message takes its place.
bool Same(const StoredMessage& a, const StoredMessage& b) {
  return a.role == b.role && a.content == b.content && a.state == TurnState::kComplete &&
         b.state == TurnState::kComplete;
}

// The hash of a transcript, message by message: Next(Next(Start(tenant), m0), m1)...
uint64_t Start(const std::string& tenant) { return absl::HashOf(absl::string_view(tenant)); }
uint64_t Next(uint64_t h, const StoredMessage& m) {
  return absl::HashOf(h, absl::string_view(m.role), absl::string_view(m.content));
}

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

void TranscriptIndex::Put(const std::string& tenant, const std::string& id,
                          const std::vector<StoredMessage>& transcript) {
  uint64_t h = Start(tenant);
  for (const StoredMessage& m : transcript) h = Next(h, m);
  absl::MutexLock lock(&mu_);
  if (auto old = hash_of_.find(id); old != hash_of_.end()) {
    auto e = by_hash_.find(old->second);
    if (e != by_hash_.end() && e->second.id == id) {
      lru_.erase(e->second.lru);
      by_hash_.erase(e);
    }
    hash_of_.erase(old);
  }
  if (auto taken = by_hash_.find(h); taken != by_hash_.end()) {
    // Another session of the same tenant holds the same transcript: the newer one wins.
    hash_of_.erase(taken->second.id);
    lru_.erase(taken->second.lru);
    by_hash_.erase(taken);
  }
  lru_.push_front(h);
  by_hash_[h] = Entry{id, static_cast<int>(transcript.size()), lru_.begin()};
  hash_of_[id] = h;
  while (by_hash_.size() > capacity_) {
    const uint64_t oldest = lru_.back();
    lru_.pop_back();
    auto e = by_hash_.find(oldest);
    hash_of_.erase(e->second.id);
    by_hash_.erase(e);
  }
}

std::vector<std::pair<int, std::string>> TranscriptIndex::Find(
    const std::string& tenant, const std::vector<StoredMessage>& messages) {
  std::vector<uint64_t> prefix(messages.size() + 1);
  prefix[0] = Start(tenant);
  for (size_t i = 0; i < messages.size(); ++i) prefix[i + 1] = Next(prefix[i], messages[i]);
  std::vector<std::pair<int, std::string>> out;
  absl::MutexLock lock(&mu_);
  for (size_t n = messages.size() - (messages.empty() ? 0 : 1); n >= 1; --n) {
    if (messages[n - 1].role != "assistant") continue;
    auto e = by_hash_.find(prefix[n]);
    if (e == by_hash_.end() || e->second.length != static_cast<int>(n)) continue;
    lru_.splice(lru_.begin(), lru_, e->second.lru);  // used: most recent
    out.emplace_back(static_cast<int>(n), e->second.id);
  }
  return out;
}

size_t TranscriptIndex::size() {
  absl::MutexLock lock(&mu_);
  return by_hash_.size();
}

}  // namespace recall::coordinator
