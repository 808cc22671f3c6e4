#include "worker/serving/session.h"

#include <algorithm>

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

int Session::max_length() const {
  int n = 0;
  for (const auto& c : caches) n = std::max(n, c->max_length());
  return n;
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
