#include "coordinator/idempotency_keys.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "coordinator/digest.h"

namespace recall::coordinator {
namespace {

// Store records: a kind byte, then the value. 's': the session id a key's turn went to.
// 'c': a completion, as length-prefixed fields (Netstrings).
constexpr char kSessionRecord = 's';
constexpr char kCompletionRecord = 'c';

// The store record of a key (SessionStore::PutRecord's names: "k:" and the key).
std::string RecordName(const std::string& key) { return "k:" + key; }

void AppendField(std::string* out, const std::string& field) {
  absl::StrAppend(out, field.size(), ":", field);
}

// The next field of `in` from `*pos`; false when `in` holds no whole field there.
bool NextField(const std::string& in, size_t* pos, std::string* field) {
  const size_t colon = in.find(':', *pos);
  if (colon == std::string::npos || colon == *pos || colon - *pos > 12) return false;
  uint64_t size = 0;
  if (!absl::SimpleAtoi(in.substr(*pos, colon - *pos), &size)) return false;
  if (size > in.size() - colon - 1) return false;
  *field = in.substr(colon + 1, size);
  *pos = colon + 1 + size;
  return true;
}

size_t BytesOf(const IdempotencyKeys::Completion& c) {
  return c.prompt_digest.size() + c.model.size() + c.reply.content.size() +
         c.reply.token_ids.size() * sizeof(int32_t);
}

}  // namespace

std::string IdempotencyKeys::Of(const std::string& tenant, const std::string& key) {
  return absl::StrCat(tenant.size(), ":", tenant, key);
}

std::string IdempotencyKeys::Digest(const std::string& prompt) {
  return Hex(Sha256().Add(prompt).Digest());
}

std::string IdempotencyKeys::EncodeCompletion(const Completion& c) {
  std::string out(1, kCompletionRecord);
  AppendField(&out, c.prompt_digest);
  AppendField(&out, c.model);
  AppendField(&out, c.reply.content);
  AppendField(&out, EncodeReply(c.reply));
  AppendField(&out, std::to_string(static_cast<int>(c.reply.state)));
  AppendField(&out, std::to_string(c.reply.lease_unix_ms));
  return out;
}

std::optional<IdempotencyKeys::Completion> IdempotencyKeys::DecodeCompletion(
    const std::string& bytes) {
  if (bytes.empty() || bytes[0] != kCompletionRecord) return std::nullopt;
  size_t pos = 1;
  Completion c;
  c.reply.role = "assistant";
  std::string reply, state, lease;
  if (!NextField(bytes, &pos, &c.prompt_digest) || !NextField(bytes, &pos, &c.model) ||
      !NextField(bytes, &pos, &c.reply.content) || !NextField(bytes, &pos, &reply) ||
      !NextField(bytes, &pos, &state) || !NextField(bytes, &pos, &lease) || pos != bytes.size()) {
    return std::nullopt;
  }
  int s = 0;
  if (!absl::SimpleAtoi(state, &s) || s < 0 || s > 3) return std::nullopt;
  if (!absl::SimpleAtoi(lease, &c.reply.lease_unix_ms)) return std::nullopt;
  DecodeReply(reply, &c.reply);
  c.reply.state = static_cast<TurnState>(s);
  return c;
}

bool IdempotencyKeys::Claim(const std::string& tenant, const std::string& key) {
  const std::string k = Of(tenant, key);
  const auto ended = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ending_.count(k) == 0; };
  absl::MutexLock lock(&mu_);
  if (ending_.count(k) > 0) mu_.AwaitWithTimeout(absl::Condition(&ended), kEndingWait);
  return running_.insert(k).second;
}

void IdempotencyKeys::Release(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  running_.erase(Of(tenant, key));
  ending_.erase(Of(tenant, key));
}

void IdempotencyKeys::Ending(const std::string& tenant, const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (running_.count(Of(tenant, key)) > 0) ending_.insert(Of(tenant, key));
}

void IdempotencyKeys::Remember(const std::string& k, const std::string& session_id) {
  if (session_of_.insert_or_assign(k, session_id).second) order_.push_back(k);
  while (order_.size() > capacity_) {
    session_of_.erase(order_.front());
    order_.pop_front();
  }
}

void IdempotencyKeys::Put(const std::string& tenant, const std::string& key,
                          const std::string& session_id) {
  {
    absl::MutexLock lock(&mu_);
    Remember(Of(tenant, key), session_id);
  }
  if (store_ == nullptr) return;
  if (absl::Status st = store_->PutSessionRecord(tenant, session_id, RecordName(key),
                                                 kSessionRecord + session_id);
      !st.ok() && !absl::IsNotFound(st)) {  // NotFound: the session was deleted since
    RECALL_LOG(WARNING) << "Idempotency-Key \"" << key << "\" of session " << QuotedId(session_id)
                        << " is not in the store (a retry elsewhere may run the turn again): "
                        << st;
  }
}

absl::Status IdempotencyKeys::OtherRequest(const std::string& key, const char* endpoint) {
  return flags::FieldError("Idempotency-Key",
                           absl::StrCat("\"", key, "\" was sent with a ", endpoint,
                                        " request; a new request needs a new key"));
}

absl::Status IdempotencyKeys::Add(const std::string& tenant, const std::string& key,
                                  const std::string& session_id) {
  if (store_ != nullptr) {
    const std::string record = kSessionRecord + session_id;
    absl::Status st = store_->AddSessionRecord(tenant, session_id, RecordName(key), record);
    if (absl::IsNotFound(st)) st = absl::OkStatus();  // the session was deleted since
    if (absl::IsAlreadyExists(st)) {
      // Another session's record: that request ran the turn. A completion's: the key names
      // another request (put over, its retry ran again). A damaged one is put over.
      absl::StatusOr<std::string> kept = store_->GetRecord(tenant, RecordName(key));
      const bool session = kept.ok() && kept->size() >= 2 && (*kept)[0] == kSessionRecord;
      if (session && *kept != record) return st;
      if (kept.ok() && DecodeCompletion(*kept).has_value()) {
        return OtherRequest(key, "/v1/completions");
      }
      st = session ? absl::OkStatus()
                   : store_->PutSessionRecord(tenant, session_id, RecordName(key), record);
      if (absl::IsNotFound(st)) st = absl::OkStatus();
    }
    if (!st.ok()) {
      RECALL_LOG(WARNING) << "Idempotency-Key \"" << key << "\" of session " << QuotedId(session_id)
                          << " is not in the store (a retry elsewhere may run the turn again): "
                          << st;
    }
  }
  absl::MutexLock lock(&mu_);
  Remember(Of(tenant, key), session_id);
  return absl::OkStatus();
}

void IdempotencyKeys::Forget(const std::string& tenant, const std::string& key,
                             const std::string& session_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = session_of_.find(Of(tenant, key));
    // Left in place (empty: unknown, Find asks the store) for order_, which names it.
    if (it != session_of_.end() && it->second == session_id) it->second.clear();
  }
  if (store_ == nullptr) return;
  if (absl::Status st = store_->DeleteRecord(tenant, RecordName(key), kSessionRecord + session_id);
      !st.ok()) {
    RECALL_LOG(WARNING) << "Idempotency-Key \"" << key << "\": " << st;
  }
}

std::string IdempotencyKeys::Find(const std::string& tenant, const std::string& key) {
  const std::string k = Of(tenant, key);
  {
    absl::MutexLock lock(&mu_);
    auto it = session_of_.find(k);
    if (it != session_of_.end() && !it->second.empty()) return it->second;
  }
  if (store_ == nullptr) return "";
  absl::StatusOr<std::string> rec = store_->GetRecord(tenant, RecordName(key));
  if (!rec.ok()) {
    if (!absl::IsNotFound(rec.status())) {
      RECALL_LOG(WARNING) << "Idempotency-Key \"" << key << "\": " << rec.status();
    }
    return "";
  }
  if (rec->size() < 2 || (*rec)[0] != kSessionRecord) return "";  // another kind of record
  const std::string session_id = rec->substr(1);
  absl::MutexLock lock(&mu_);
  Remember(k, session_id);
  return session_id;
}

void IdempotencyKeys::RememberCompletion(const std::string& k, Completion completion) {
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

void IdempotencyKeys::PutCompletion(const std::string& tenant, const std::string& key,
                                    Completion completion) {
  const std::string record = store_ != nullptr ? EncodeCompletion(completion) : "";
  {
    absl::MutexLock lock(&mu_);
    RememberCompletion(Of(tenant, key), std::move(completion));
  }
  if (store_ == nullptr) return;
  if (absl::Status st = store_->PutRecord(tenant, RecordName(key), record); !st.ok()) {
    RECALL_LOG(WARNING) << "Idempotency-Key \"" << key
                        << "\": the completion is not in the store (a retry elsewhere may run "
                           "it again): "
                        << st;
  }
}

absl::Status IdempotencyKeys::AddCompletion(const std::string& tenant, const std::string& key,
                                            Completion completion, const std::string& was) {
  if (store_ != nullptr) {
    const std::string record = EncodeCompletion(completion);
    // Taken over: let go only while it is what was read, then added like a new one.
    absl::Status st =
        was.empty() ? absl::OkStatus() : store_->DeleteRecord(tenant, RecordName(key), was);
    if (st.ok()) st = store_->AddRecord(tenant, RecordName(key), record);
    if (absl::IsAlreadyExists(st) && !was.empty()) return st;
    if (absl::IsAlreadyExists(st)) {
      // Another request's completion: it runs or ran. A chat's session: the key names another
      // request (put over, its retry ran again). A damaged one is put over.
      absl::StatusOr<std::string> kept = store_->GetRecord(tenant, RecordName(key));
      if (kept.ok() && DecodeCompletion(*kept).has_value()) return st;
      if (kept.ok() && kept->size() >= 2 && (*kept)[0] == kSessionRecord) {
        return OtherRequest(key, "/v1/chat/completions");
      }
      st = store_->PutRecord(tenant, RecordName(key), record);
    }
    if (!st.ok()) {
      RECALL_LOG(WARNING) << "Idempotency-Key \"" << key
                          << "\": the completion is not in the store (a retry elsewhere may run "
                             "it again): "
                          << st;
    }
  }
  absl::MutexLock lock(&mu_);
  RememberCompletion(Of(tenant, key), std::move(completion));
  return absl::OkStatus();
}

std::optional<IdempotencyKeys::Completion> IdempotencyKeys::FindCompletion(
    const std::string& tenant, const std::string& key, std::string* record) {
  if (record != nullptr) record->clear();
  // A completion's record changes (in progress, interrupted, complete) on whichever
  // coordinator runs it: the store is asked first; the memory copy answers only without a
  // store, or when the store does not.
  if (store_ != nullptr) {
    absl::StatusOr<std::string> rec = store_->GetRecord(tenant, RecordName(key));
    if (rec.ok()) {
      std::optional<Completion> c = DecodeCompletion(*rec);
      if (c.has_value() && record != nullptr) *record = *rec;
      if (!c.has_value() && !rec->empty() && (*rec)[0] == kCompletionRecord) {
        RECALL_LOG(WARNING) << "Idempotency-Key \"" << key
                            << "\": its stored completion is damaged; ignored";
      }
      return c;
    }
    if (absl::IsNotFound(rec.status())) return std::nullopt;
    RECALL_LOG(WARNING) << "Idempotency-Key \"" << key << "\": " << rec.status()
                        << "; answering from this coordinator's memory";
  }
  absl::MutexLock lock(&mu_);
  auto it = completions_.find(Of(tenant, key));
  if (it == completions_.end()) return std::nullopt;
  return it->second;
}

}  // namespace recall::coordinator
