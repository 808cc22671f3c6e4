#include "coordinator/idempotency_keys.h"

#include "absl/strings/str_cat.h"

namespace recall::coordinator {

std::string IdempotencyKeys::Of(const std::string& tenant, const std::string& key) {
  return absl::StrCat(tenant.size(), ":", tenant, key);
}

bool IdempotencyKeys::Claim(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  return running_.insert(Of(tenant, key)).second;
}

void IdempotencyKeys::Release(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  running_.erase(Of(tenant, key));
}

void IdempotencyKeys::Put(const std::string& tenant, const std::string& key,
                          const std::string& session_id) {
  const std::string k = Of(tenant, key);
  absl::MutexLock lock(&mu_);
  if (session_of_.insert_or_assign(k, session_id).second) order_.push_back(k);
  while (order_.size() > capacity_) {
    session_of_.erase(order_.front());
    order_.pop_front();
  }
}

std::string IdempotencyKeys::Find(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = session_of_.find(Of(tenant, key));
  return it == session_of_.end() ? "" : it->second;
}

namespace {

size_t BytesOf(const IdempotencyKeys::Completion& c) {
  return c.prompt.size() + c.model.size() + c.reply.content.size() +
         c.reply.token_ids.size() * sizeof(int32_t);
}

}  // namespace

void IdempotencyKeys::PutCompletion(const std::string& tenant, const std::string& key,
                                    Completion completion) {
  const std::string k = Of(tenant, key);
  absl::MutexLock lock(&mu_);
  completion_bytes_ += BytesOf(completion);
  auto [it, added] = completions_.try_emplace(k);
  if (!added) completion_bytes_ -= BytesOf(it->second);
  it->second = std::move(completion);
  if (added) completion_order_.push_back(k);
  while (!completion_order_.empty() &&
         (completion_order_.size() > capacity_ || completion_bytes_ > kCompletionBytes)) {
    auto old = completions_.find(completion_order_.front());
    completion_bytes_ -= BytesOf(old->second);
    completions_.erase(old);
    completion_order_.pop_front();
  }
}

std::optional<IdempotencyKeys::Completion> IdempotencyKeys::FindCompletion(
    const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = completions_.find(Of(tenant, key));
  if (it == completions_.end()) return std::nullopt;
  return it->second;
}

}  // namespace recall::coordinator
