// The store-independent parts of session_store.h: turn states, the prompt's complete turns,
// the reply encoding both stores use, and OpenStore.
#include "coordinator/session_store.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"

namespace recall::coordinator {

const char* TurnStateName(TurnState state) {
  switch (state) {
    case TurnState::kComplete:
      return "complete";
    case TurnState::kInProgress:
      return "in_progress";
    case TurnState::kInterrupted:
      return "interrupted";
    case TurnState::kFailed:
      return "failed";
  }
  return "unknown";
}

std::vector<StoredMessage> CompleteTurns(const std::vector<StoredMessage>& messages, int count) {
  std::vector<StoredMessage> out;
  std::vector<StoredMessage> turn;  // the messages since the last reply
  for (int i = 0; i < count && i < static_cast<int>(messages.size()); ++i) {
    const StoredMessage& m = messages[i];
    if (m.role == "system") {
      out.push_back(m);
    } else if (m.role != "assistant") {
      turn.push_back(m);
    } else {
      // What the reply's turn took back ran after the last kept reply the model gave (not one
      // the client wrote: a rebuild replays that as text of its turn).
      for (auto it = out.rbegin(); !m.taken_back.empty() && it != out.rend(); ++it) {
        if (it->role != "assistant" || it->finish == 0) continue;
        it->taken_back_after.insert(it->taken_back_after.end(), m.taken_back.begin(),
                                    m.taken_back.end());
        break;
      }
      if (m.state == TurnState::kComplete) {
        out.insert(out.end(), turn.begin(), turn.end());
        out.push_back(m);
      }
      turn.clear();
    }
  }
  out.insert(out.end(), turn.begin(), turn.end());
  return out;
}

namespace {
constexpr int32_t kSeedMarker = -2;  // no finish reason is negative
constexpr int32_t kTakenBackMarker = -3;
constexpr int32_t kOwnTakenBackMarker = -4;  // TakenBackTurn::own
}  // namespace

std::string EncodeReply(const StoredMessage& m) {
  if (m.token_ids.empty() && m.finish == 0 && !m.seed.has_value() && m.taken_back.empty()) {
    return "";
  }
  std::string out;
  out.reserve(4 * (m.token_ids.size() + 4));
  auto put = [&out](int32_t v) {
    const uint32_t u = static_cast<uint32_t>(v);
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((u >> (8 * b)) & 0xFF));
  };
  for (const TakenBackTurn& t : m.taken_back) {
    put(t.own ? kOwnTakenBackMarker : kTakenBackMarker);
    put(t.prompt_tokens);
    put(static_cast<int32_t>(t.token_ids.size()));
    for (int32_t id : t.token_ids) put(id);
  }
  if (m.seed.has_value()) {
    put(kSeedMarker);
    put(static_cast<int32_t>(static_cast<uint32_t>(*m.seed & 0xFFFFFFFFu)));
    put(static_cast<int32_t>(static_cast<uint32_t>(*m.seed >> 32)));
  }
  put(m.finish);
  for (int32_t id : m.token_ids) put(id);
  return out;
}

void DecodeReply(const std::string& bytes, StoredMessage* m) {
  m->token_ids.clear();
  m->finish = 0;
  m->seed.reset();
  m->taken_back.clear();
  if (bytes.size() < 4 || bytes.size() % 4 != 0) return;  // none (or unreadable: as text)
  auto get = [&bytes](size_t at) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b)
      u |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + b])) << (8 * b);
    return static_cast<int32_t>(u);
  };
  const size_t words = bytes.size() / 4;
  size_t at = 0;  // in words
  while (at < words && (get(4 * at) == kTakenBackMarker || get(4 * at) == kOwnTakenBackMarker)) {
    if (words - at < 3) return m->taken_back.clear();  // unreadable
    const int32_t n = get(4 * (at + 2));
    if (n < 0 || static_cast<size_t>(n) > words - at - 3) return m->taken_back.clear();
    TakenBackTurn& t = m->taken_back.emplace_back();
    t.own = get(4 * at) == kOwnTakenBackMarker;
    t.prompt_tokens = get(4 * (at + 1));
    for (size_t i = 0; i < static_cast<size_t>(n); ++i)
      t.token_ids.push_back(get(4 * (at + 3 + i)));
    at += 3 + static_cast<size_t>(n);
  }
  if (at < words && get(4 * at) == kSeedMarker) {
    if (words - at < 4) return;  // unreadable
    m->seed = static_cast<uint64_t>(static_cast<uint32_t>(get(4 * (at + 1)))) |
              static_cast<uint64_t>(static_cast<uint32_t>(get(4 * (at + 2)))) << 32;
    at += 3;
  }
  if (at >= words) return;
  m->finish = get(4 * at);
  for (++at; at < words; ++at) m->token_ids.push_back(get(4 * at));
}

namespace {

// A --store URL's parts: redis:// host and port, or sqlite:// path.
struct StoreUrl {
  bool redis = false;
  std::string host;
  int port = 6379;
  std::string path;
};

absl::StatusOr<StoreUrl> ParseStoreUrl(const std::string& url) {
  const std::string redis = "redis://", sqlite = "sqlite://";
  StoreUrl out;
  if (absl::StartsWith(url, redis)) {
    const std::string rest = url.substr(redis.size());
    if (rest.find('@') != std::string::npos) {
      // Not echoed: the part before '@' is a password.
      return flags::FieldError(
          "store_url",
          "a user or password in the URL (redis://USER:PASSWORD@HOST) is not supported: Recall "
          "does not send AUTH; run Redis without a password where only the coordinators reach "
          "it (a private network, or its own bind address)");
    }
    const size_t colon = rest.rfind(':');
    out.redis = true;
    out.host = rest.substr(0, colon);
    if ((colon != std::string::npos && !absl::SimpleAtoi(rest.substr(colon + 1), &out.port)) ||
        out.port < 1 || out.port > 65535 || out.host.empty()) {
      return flags::FieldError("store_url",
                               absl::StrCat("expected redis://HOST[:PORT] (port in [1, 65535]), "
                                            "got \"",
                                            url, "\""));
    }
    return out;
  }
  if (absl::StartsWith(url, sqlite)) {
    out.path = url.substr(sqlite.size());
    if (out.path.empty()) {
      return flags::FieldError("store_url", "sqlite:// needs a file's path (sqlite://PATH)");
    }
    return out;
  }
  // A bare HOST:PORT or path would be read as an SQLite file's name.
  return flags::FieldError(
      "store_url", absl::StrCat("expected redis://HOST[:PORT] or sqlite://PATH, got \"", url,
                                "\" (without it, sessions are in the data "
                                "directory's sessions.db)"));
}

}  // namespace

absl::Status TenantFull(int tenant_limit) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the tenant has reached its limit of ", tenant_limit, " sessions"));
}

absl::Status CheckStoreUrl(const std::string& url) { return ParseStoreUrl(url).status(); }

absl::StatusOr<std::unique_ptr<SessionStore>> OpenStore(const std::string& url,
                                                        const StoreRisks& risks) {
  if (url.find("://") == std::string::npos) {
    return OpenSqliteStore(url, risks.allow_loss);  // a file's path
  }
  RECALL_ASSIGN_OR_RETURN(const StoreUrl parsed, ParseStoreUrl(url));
  if (parsed.redis) return OpenRedisStore(parsed.host, parsed.port, risks.allow_volatile);
  return OpenSqliteStore(parsed.path, risks.allow_loss);
}

std::string StoredText(std::string text) {
  return utf8::IsValid(text) ? text : utf8::ToValidLossy(text);
}

absl::StatusOr<std::map<std::string, std::string>> ParseStoredMetadata(const std::string& text,
                                                                       const std::string& id) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  std::map<std::string, std::string> out;
  bool ok = j.is_object();
  for (auto it = ok ? j.begin() : j.end(); ok && it != j.end(); ++it) {
    ok = it.value().is_string();
    if (ok) out[it.key()] = it.value().get<std::string>();
  }
  if (!ok) {
    return absl::DataLossError(absl::StrCat("session store: the metadata of session ", QuotedId(id),
                                            " is not a JSON object of strings"));
  }
  return out;
}

absl::Status RunningElsewhere() {
  return absl::FailedPreconditionError(
      "session_id: a turn of this session is running on another coordinator (or on one that "
      "stopped: its reply is taken as interrupted once its lease passes); send the next when "
      "it ends (retryable)");
}

}  // namespace recall::coordinator
