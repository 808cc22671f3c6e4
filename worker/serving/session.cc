#include "worker/serving/session.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "common/logging.h"
#include "worker/serving/episode_builder.h"

namespace recall::serving {

SessionEpisodes::SessionEpisodes() = default;
SessionEpisodes::~SessionEpisodes() = default;

int64_t SessionEpisodes::parked_host_bytes() const {
  int64_t n = 0;
  for (const auto& c : parked) {
    if (c != nullptr) n += c->host_bytes();
  }
  return n;
}

uint64_t ChainDigest(uint64_t digest, const model::ChatMessage& m) {
  return absl::HashOf(digest, m.role, m.content);
}

uint64_t TranscriptDigest(const std::vector<model::ChatMessage>& messages) {
  uint64_t digest = kEmptyTranscriptDigest;
  for (const model::ChatMessage& m : messages) digest = ChainDigest(digest, m);
  return digest;
}

namespace {
int64_t Bytes(const model::ChatMessage& m) {
  return static_cast<int64_t>(m.role.size() + m.content.size());
}
}  // namespace

void Session::SetTranscript(std::vector<model::ChatMessage> all) {
  messages = std::move(all);
  message_count = static_cast<int64_t>(messages.size());
  digest = TranscriptDigest(messages);
  message_bytes = 0;
  for (const model::ChatMessage& m : messages) message_bytes += Bytes(m);
}

void Session::AddMessages(const std::vector<model::ChatMessage>& added) {
  for (const model::ChatMessage& m : added) {
    messages.push_back(m);
    digest = ChainDigest(digest, m);
    message_bytes += Bytes(m);
  }
  message_count += static_cast<int64_t>(added.size());
  if (episodic != nullptr || messages.size() < 2) return;
  // From the user message before the last message on.
  size_t from = messages.size() - 1;
  while (from > 0 && messages[from].role != "user") --from;
  if (from == 0) return;
  for (size_t i = 0; i < from; ++i) message_bytes -= Bytes(messages[i]);
  messages.erase(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(from));
  if (messages.capacity() > 64 && messages.capacity() > 4 * messages.size()) {
    messages.shrink_to_fit();  // after a rebuild's whole history
  }
}

void Session::Feed(const int32_t* begin, const int32_t* end, size_t context) {
  tokens.insert(tokens.end(), begin, end);
  tokens_fed += end - begin;
  if (episodic == nullptr && tokens.size() > 3 * context) {
    tokens.erase(tokens.begin(), tokens.end() - static_cast<std::ptrdiff_t>(2 * context));
  }
}

void Session::Unfeed(int n) {
  if (n <= 0) return;
  RECALL_CHECK(resident()) << "Unfeed: no resident cache to give back";
  int32_t next = 0;
  for (const auto& c : caches) {
    c->DropNewest(n);
    next = std::max(next, c->next_position());
  }
  for (const auto& c : caches) c->RaiseNextPosition(next);  // the ranks agree on it
  for (const auto& e : evictors) e->FollowDrop();
  tokens.resize(tokens.size() - std::min(tokens.size(), static_cast<size_t>(n)));
  tokens_fed -= n;
}

int64_t Session::transcript_bytes() const {
  return message_bytes + static_cast<int64_t>(reply_tail.size()) +
         static_cast<int64_t>((tokens.capacity() + pending.capacity()) * sizeof(int32_t));
}

int Session::max_length() const {
  int n = 0;
  for (const auto& c : caches) n = std::max(n, c->max_length());
  return n;
}

bool Session::ends_at_context() const {
  if (positions != runtime::Positions::kCompact || episodic != nullptr) return false;
  return evictors.empty() || evictor()->policy().compresses_prefill();
}

int64_t Session::bytes_held() const {
  int64_t sum = 0;
  for (const auto& c : caches) sum += c->bytes_held();
  return sum;
}

int64_t Session::state_bytes() const {
  int64_t sum = 0;
  for (const auto& e : evictors) sum += e->state_bytes();
  return sum;
}

int64_t Session::host_bytes() const {
  int64_t sum = 0;
  for (const auto& c : caches) sum += c->host_bytes();
  return sum + (offloaded() ? state_bytes() : 0);
}

void Session::Offload() {
  for (auto& c : caches) c->OffloadToHost();
}

absl::Status Session::Restore() {
  for (size_t r = 0; r < caches.size(); ++r) {
    absl::Status st = caches[r]->RestoreFromHost();
    if (!st.ok()) {
      for (size_t back = 0; back < r; ++back) caches[back]->OffloadToHost();
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::serving
