// ChatService: sessions (create, get, list, delete) and models. Converse and Generate are
// in converse.cc.
#include "coordinator/chat_service.h"

#include <chrono>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/grpc_status.h"

namespace recall::coordinator {
namespace {

std::string NewSessionId() {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrCat("s-", absl::Hex(rng(), absl::kZeroPad16), absl::Hex(rng(), absl::kZeroPad16));
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Page tokens are opaque to clients: "p1." and the hex of the last session id listed.
std::string EncodePageToken(const std::string& id) {
  return absl::StrCat("p1.", absl::BytesToHexString(id));
}

std::optional<std::string> DecodePageToken(const std::string& token) {
  constexpr absl::string_view kPrefix = "p1.";
  if (token.size() > 600 || !absl::StartsWith(token, kPrefix)) return std::nullopt;
  const absl::string_view hex = absl::string_view(token).substr(kPrefix.size());
  if (hex.empty() || hex.size() % 2 != 0) return std::nullopt;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return absl::HexStringToBytes(hex);
}

void ToProto(const SessionRecord& r, bool with_messages, v1::Session* out) {
  out->set_session_id(r.id);
  out->set_model(r.model);
  out->mutable_cache()->ParseFromString(r.cache_settings);
  out->mutable_metadata()->insert(r.metadata.begin(), r.metadata.end());
  out->set_created_unix_ms(r.created_unix_ms);
  int users = 0, replies = 0;
  for (const StoredMessage& m : r.messages) {
    users += m.role == "user";
    replies += m.role == "assistant";
    if (with_messages) {
      v1::ChatMessage* pm = out->add_messages();
      pm->set_role(m.role);
      pm->set_content(m.content);
    }
  }
  out->set_turns(with_messages ? std::min(users, replies) : r.message_count / 2);
}

}  // namespace

ChatService::ChatService(SessionStore& store, WorkerRegistry& workers, ApiKeys keys,
                         CoordinatorOptions options, metrics::Registry& metrics)
    : store_(store),
      workers_(workers),
      keys_(std::move(keys)),
      options_(options),
      metrics_(metrics),
      store_pool_(options.store_threads) {}

void ChatService::RememberEpisodes(const std::string& key, const v1::TurnDone& done) {
  absl::MutexLock lock(&mu_);
  if (done.has_episodes()) {
    episodes_[key] = done.episodes();
  } else {
    episodes_.erase(key);  // not built (yet, or any more after a rebuild)
  }
}

void ChatService::ForgetEpisodes(const std::string& key) {
  absl::MutexLock lock(&mu_);
  episodes_.erase(key);
}

bool ChatService::RecallEpisodes(const std::string& key, v1::EpisodesReport* out) {
  absl::MutexLock lock(&mu_);
  auto it = episodes_.find(key);
  if (it == episodes_.end()) return false;
  *out = it->second;
  return true;
}

bool ChatService::BeginTurn(const std::string& key) {
  absl::MutexLock lock(&mu_);
  return running_.insert(key).second;
}

void ChatService::EndTurn(const std::string& key) {
  absl::MutexLock lock(&mu_);
  running_.erase(key);
}

grpc::Status ChatService::CreateSession(grpc::ServerContext* context,
                                        const v1::CreateSessionRequest* request,
                                        v1::Session* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (request->system_prompt().size() > options_.max_message_bytes) {
    return Invalid("system_prompt", absl::StrCat(request->system_prompt().size(),
                                                 " bytes; at most ", options_.max_message_bytes));
  }
  if (!IsUtf8(request->system_prompt())) return Invalid("system_prompt", "is not valid UTF-8");
  if (request->metadata_size() > 64) {
    return Invalid("metadata", absl::StrCat(request->metadata_size(), " entries; at most 64"));
  }
  RECALL_GRPC_ASSIGN_OR_RETURN(const int count, store_.CountSessions(tenant));
  if (count >= options_.max_sessions_per_tenant) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("tenant has ", count, " sessions, the limit is ",
                                     options_.max_sessions_per_tenant,
                                     "; delete some (not retryable)"));
  }
  std::string model = request->model();
  std::set<std::string> served;
  for (const WorkerView& w : workers_.Snapshot()) {
    if (!w.info.model().empty()) served.insert(w.info.model());
  }
  if (model.empty() && served.size() == 1) model = *served.begin();
  if (!model.empty() && !served.empty() && served.count(model) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("model: no worker serves \"", model, "\""));
  }
  if (request->cache().has_kv_dtype()) {
    const std::string& t = request->cache().kv_dtype();
    if (t != "f32" && t != "bf16" && t != "f16" && t != "int8") {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("cache.kv_dtype: \"", t, "\" is not one of f32, bf16, f16, int8"));
    }
    std::set<std::string> stored;
    for (const WorkerView& w : workers_.Snapshot()) {
      if (!w.info.default_cache().kv_dtype().empty())
        stored.insert(w.info.default_cache().kv_dtype());
    }
    if (!stored.empty() && stored.count(t) == 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("cache.kv_dtype: no worker stores ", t,
                                       " (the workers store ", absl::StrJoin(stored, ", "), ")"));
    }
  }
  SessionRecord r;
  r.id = NewSessionId();
  r.tenant = tenant;
  r.model = model;
  request->cache().SerializeToString(&r.cache_settings);
  r.metadata.insert(request->metadata().begin(), request->metadata().end());
  r.created_unix_ms = NowMs();
  RECALL_GRPC_RETURN_IF_ERROR(store_.Create(r));
  if (!request->system_prompt().empty()) {
    RECALL_GRPC_RETURN_IF_ERROR(
        store_.Append(tenant, r.id, 0, {"system", request->system_prompt()}));
    r.messages.push_back({"system", request->system_prompt()});
  }
  metrics_.GetCounter("recall_coordinator_sessions_created_total", "Sessions created")
      ->Increment();
  ToProto(r, true, response);
  return grpc::Status::OK;
}

grpc::Status ChatService::GetSession(grpc::ServerContext* context,
                                     const v1::GetSessionRequest* request,
                                     v1::Session* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (grpc::Status st = CheckSessionId(request->session_id()); !st.ok()) return st;
  RECALL_GRPC_ASSIGN_OR_RETURN(const SessionRecord r, store_.Get(tenant, request->session_id()));
  ToProto(r, true, response);
  RecallEpisodes(tenant + "/" + r.id, response->mutable_episodes());
  if (response->episodes().windows().empty()) response->clear_episodes();
  return grpc::Status::OK;
}

grpc::Status ChatService::ListSessions(grpc::ServerContext* context,
                                       const v1::ListSessionsRequest* request,
                                       v1::ListSessionsResponse* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  int size = request->page_size() == 0 ? 50 : request->page_size();
  if (size < 0 || size > 1000) {
    return Invalid("page_size", absl::StrCat("must be in [1, 1000], got ", size));
  }
  std::string after;  // the last session of the previous page
  if (!request->page_token().empty()) {
    std::optional<std::string> id = DecodePageToken(request->page_token());
    if (!id.has_value()) {
      return Invalid("page_token", "is not a next_page_token of ListSessions");
    }
    after = *id;
  }
  RECALL_GRPC_ASSIGN_OR_RETURN(std::vector<SessionRecord> page,
                               store_.List(tenant, after, size + 1));
  const bool more = static_cast<int>(page.size()) > size;
  if (more) page.pop_back();
  for (const SessionRecord& r : page) ToProto(r, false, response->add_sessions());
  if (more) response->set_next_page_token(EncodePageToken(page.back().id));
  return grpc::Status::OK;
}

grpc::Status ChatService::DeleteSession(grpc::ServerContext* context,
                                        const v1::DeleteSessionRequest* request,
                                        v1::DeleteSessionResponse*) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (grpc::Status st = CheckSessionId(request->session_id()); !st.ok()) return st;
  RECALL_GRPC_ASSIGN_OR_RETURN(const SessionRecord r, store_.Get(tenant, request->session_id()));
  RECALL_GRPC_RETURN_IF_ERROR(store_.Delete(tenant, r.id));
  ForgetEpisodes(tenant + "/" + r.id);
  // Best effort: the worker's cache is derived state and would age out anyway.
  if (auto stub = workers_.Stub(r.worker); stub != nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    workers_.Attach(&ctx);
    v1::DropSessionRequest drop;
    drop.set_session_id(r.id);
    v1::DropSessionResponse ignored;
    stub->DropSession(&ctx, drop, &ignored);
  }
  return grpc::Status::OK;
}

grpc::Status ChatService::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest*,
                                     v1::ListModelsResponse* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  std::map<std::string, v1::ModelInfo> models;
  for (const WorkerView& w : workers_.Snapshot()) {
    if (w.info.model().empty()) continue;
    v1::ModelInfo& m = models[w.info.model()];
    m.set_name(w.info.model());
    m.set_context_length(w.info.context_length());
    if (m.policies().empty()) *m.mutable_policies() = w.info.policies();
    m.set_workers(m.workers() + (w.healthy && !w.draining ? 1 : 0));
  }
  for (auto& [name, m] : models) *response->add_models() = m;
  return grpc::Status::OK;
}

}  // namespace recall::coordinator
