// ChatService: sessions (create, get, list, delete) and models. Converse and Generate are
// in converse.cc.
#include "coordinator/chat_service.h"

#include <chrono>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/digest.h"
#include "coordinator/grpc_status.h"
#include "coordinator/turn_ids.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace recall::coordinator {
namespace {

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
  // The id stays as stored in the record (it is the store's key); a damaged one is listed
  // with U+FFFD in place of what is not UTF-8, and cannot be named back. (The store makes
  // every other text valid as it reads it: StoredText.)
  out->set_session_id(StoredText(r.id));
  out->set_model(r.model);
  out->mutable_cache()->ParseFromString(r.cache_settings);
  out->mutable_metadata()->insert(r.metadata.begin(), r.metadata.end());
  out->set_created_unix_ms(r.created_unix_ms);
  int complete = 0;  // replies that ended (not streaming, interrupted or failed)
  for (const StoredMessage& m : r.messages) {
    complete += m.role == "assistant" && m.state == TurnState::kComplete;
    if (with_messages) {
      v1::ChatMessage* pm = out->add_messages();
      pm->set_role(m.role);
      pm->set_content(m.content);
      pm->set_state(static_cast<v1::TurnState>(m.state));
      pm->set_turn_id(m.turn_id);
      // How a reply ended (a cut at max_tokens: LENGTH), as its turn's done said.
      if (m.role == "assistant" && v1::FinishReason_IsValid(m.finish)) {
        pm->set_finish_reason(static_cast<v1::FinishReason>(m.finish));
      }
    }
  }
  out->set_turns(with_messages ? complete : r.message_count / 2);
}

}  // namespace

ChatService::ChatService(Conversations& conversations, SessionStore& store, WorkerRegistry& workers,
                         const ApiKeys& keys, metrics::Registry& metrics)
    : conversations_(conversations),
      store_(store),
      workers_(workers),
      keys_(keys),
      options_(conversations.options()),
      metrics_(metrics),
      end_pool_(options_.store_threads),
      store_pool_(options_.store_threads),
      create_requests_(store) {}

namespace {

// What a CreateSession asks, its request_id aside (CreateRequests): hex SHA-256.
std::string RequestDigest(const v1::CreateSessionRequest& request) {
  std::string cache;
  {
    google::protobuf::io::StringOutputStream out(&cache);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    request.cache().SerializeToCodedStream(&coded);
  }
  Sha256 sha;
  sha.AddField(request.model()).AddField(request.system_prompt()).AddField(cache);
  const std::map<std::string, std::string> sorted(request.metadata().begin(),
                                                  request.metadata().end());
  for (const auto& [key, value] : sorted) sha.AddField(key).AddField(value);
  return Hex(sha.Digest());
}

}  // namespace

grpc::Status ChatService::CreateSession(grpc::ServerContext* context,
                                        const v1::CreateSessionRequest* request,
                                        v1::Session* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (request->system_prompt().size() > options_.max_message_bytes) {
    return Invalid("system_prompt", absl::StrCat(request->system_prompt().size(),
                                                 " bytes; at most ", options_.max_message_bytes));
  }
  if (!IsUtf8(request->system_prompt())) return Invalid("system_prompt", "is not valid UTF-8");
  if (request->metadata_size() > kMaxMetadataEntries) {
    return Invalid("metadata", absl::StrCat(request->metadata_size(), " entries; at most ",
                                            kMaxMetadataEntries));
  }
  size_t metadata_bytes = 0;
  for (const auto& [key, value] : request->metadata()) {
    if (key.empty() || key.size() > kMaxMetadataKeyBytes) {
      return Invalid("metadata", absl::StrCat("a key of ", key.size(), " bytes; keys are 1 to ",
                                              kMaxMetadataKeyBytes, " bytes"));
    }
    metadata_bytes += key.size() + value.size();
  }
  // Sessions are listed with their metadata: a page of them must stay a readable message.
  if (metadata_bytes > kMaxMetadataBytes) {
    return Invalid("metadata", absl::StrCat(metadata_bytes, " bytes of keys and values; at most ",
                                            kMaxMetadataBytes));
  }
  RECALL_GRPC_RETURN_IF_ERROR(conversations_.CheckWorkerKnown());
  const auto create = [&] {
    return conversations_.Create(tenant, request->model(), request->cache(),
                                 {request->metadata().begin(), request->metadata().end()},
                                 request->system_prompt());
  };
  absl::StatusOr<SessionRecord> made;
  if (request->request_id().empty()) {
    made = create();
  } else {
    RECALL_GRPC_RETURN_IF_ERROR(CheckTurnId("request_id", request->request_id()));
    made = create_requests_.Once(tenant, request->request_id(), RequestDigest(*request), create);
  }
  if (!made.ok()) return ToGrpc(made.status());
  ToProto(*made, true, response);
  return grpc::Status::OK;
}

grpc::Status ChatService::GetSession(grpc::ServerContext* context,
                                     const v1::GetSessionRequest* request,
                                     v1::Session* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (grpc::Status st = CheckSessionId(request->session_id()); !st.ok()) return st;
  const std::string key = tenant + "/" + request->session_id();
  const bool running_before = conversations_.Running(key);
  absl::StatusOr<SessionRecord> got = store_.Get(tenant, request->session_id());
  if (!got.ok()) return ToGrpc(conversations_.ExplainMissing(got.status()));
  const SessionRecord& r = *got;
  ToProto(r, true, response);
  // A reply this coordinator left in progress with no turn of it running here (its end could
  // not be stored: a full disk, a store outage) was interrupted: shown so (the session's next
  // turn settles it in the store). Another coordinator's stays as its lease says.
  if (!r.messages.empty() && !running_before && conversations_.OwnOrphan(key, r.messages.back())) {
    response->mutable_messages(response->messages_size() - 1)
        ->set_state(v1::TURN_STATE_INTERRUPTED);
  }
  conversations_.RecallEpisodes(key, response->mutable_episodes());
  if (response->episodes().windows().empty()) response->clear_episodes();
  v1::TurnDone last;
  if (conversations_.RecallLastTurn(tenant + "/" + r.id, &last)) {
    response->set_total_tokens(last.usage().prompt_tokens() + last.usage().generated_tokens());
    response->set_held_tokens(last.held_tokens());
    response->set_kv_bytes(last.kv_bytes());
  }
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
  bool more = static_cast<int>(page.size()) > size;
  if (more) page.pop_back();
  // A page stays under kMaxPageBytes (gRPC clients read 4 MiB by default): the sessions
  // past it go to the next page.
  size_t listed = 0, bytes = 0;
  for (; listed < page.size(); ++listed) {
    v1::Session* s = response->add_sessions();
    ToProto(page[listed], false, s);
    bytes += s->ByteSizeLong() + 8;  // and its field tag and length
    if (listed > 0 && bytes > kMaxPageBytes) {
      response->mutable_sessions()->RemoveLast();
      more = true;
      break;
    }
  }
  if (more) response->set_next_page_token(EncodePageToken(page[listed - 1].id));
  return grpc::Status::OK;
}

grpc::Status ChatService::DeleteSession(grpc::ServerContext* context,
                                        const v1::DeleteSessionRequest* request,
                                        v1::DeleteSessionResponse*) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  if (grpc::Status st = CheckSessionId(request->session_id()); !st.ok()) return st;
  absl::StatusOr<SessionRecord> got = store_.GetRecent(tenant, request->session_id(), "");
  if (!got.ok()) return ToGrpc(conversations_.ExplainMissing(got.status()));
  const SessionRecord& r = *got;
  RECALL_GRPC_RETURN_IF_ERROR(store_.Delete(tenant, r.id));
  conversations_.ForgetEpisodes(tenant + "/" + r.id);
  workers_.DropSession(r.worker, r.id);
  return grpc::Status::OK;
}

grpc::Status ChatService::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest*,
                                     v1::ListModelsResponse* response) {
  RECALL_GRPC_ASSIGN_OR_RETURN(const std::string tenant, keys_.Authenticate(*context));
  for (v1::ModelInfo& m : conversations_.Models()) *response->add_models() = std::move(m);
  return grpc::Status::OK;
}

}  // namespace recall::coordinator
