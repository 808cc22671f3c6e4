#include "worker/service/worker_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace recall::service {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

std::vector<model::ChatMessage> Messages(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& in) {
  std::vector<model::ChatMessage> out;
  out.reserve(in.size());
  for (const v1::ChatMessage& m : in) out.push_back({m.role(), m.content()});
  return out;
}

v1::FinishReason ToProto(serving::TurnFinish f) {
  switch (f) {
    case serving::TurnFinish::kLength:
      return v1::FINISH_REASON_LENGTH;
    case serving::TurnFinish::kStop:
      return v1::FINISH_REASON_STOP;
    case serving::TurnFinish::kContext:
      return v1::FINISH_REASON_CONTEXT;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

serving::TurnRequest FromProto(const v1::RunTurnRequest& r, int default_max_tokens) {
  serving::TurnRequest out;
  out.session_id = r.session_id();
  out.request_id = r.request_id();
  out.messages = Messages(r.messages());
  out.history_length = r.history_length();
  out.history = Messages(r.history());
  const v1::SamplingParams& s = r.sampling();
  if (s.has_temperature()) out.sampling.temperature = s.temperature();
  if (s.has_top_p()) out.sampling.top_p = s.top_p();
  if (s.has_top_k()) out.sampling.top_k = s.top_k();
  if (s.has_repetition_penalty()) out.sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_seed()) out.sampling.seed = s.seed();
  out.max_tokens = s.has_max_tokens() ? s.max_tokens() : default_max_tokens;
  out.stop.assign(s.stop().begin(), s.stop().end());
  out.logprobs = s.has_logprobs() && s.logprobs();
  out.resume_tokens.assign(r.resume_tokens().begin(), r.resume_tokens().end());
  const v1::CacheSettings& c = r.cache();
  if (c.has_policy()) out.cache.policy = c.policy();
  if (c.has_budget_tokens()) out.cache.budget_tokens = c.budget_tokens();
  if (c.has_budget_fraction()) out.cache.budget_fraction = c.budget_fraction();
  if (c.has_window()) out.cache.window = c.window();
  if (c.has_alpha()) out.cache.alpha = c.alpha();
  if (c.has_tp_eviction()) out.cache.tp_eviction = c.tp_eviction();
  if (c.has_episodes()) out.cache.episodes = c.episodes();
  if (c.has_embedder()) out.cache.embedder = c.embedder();
  if (c.has_block_tokens()) out.cache.block_tokens = c.block_tokens();
  if (c.has_recluster_turns()) out.cache.recluster_turns = c.recluster_turns();
  if (c.has_positions()) out.cache.positions = c.positions();
  if (c.has_kv_dtype()) out.cache.kv_dtype = c.kv_dtype();
  return out;
}

WorkerService::WorkerService(serving::Scheduler& scheduler, WorkerIdentity identity)
    : scheduler_(scheduler), identity_(std::move(identity)) {}

grpc::Status WorkerService::RunTurn(grpc::ServerContext* context,
                                    const v1::RunTurnRequest* request,
                                    grpc::ServerWriter<v1::TurnEvent>* writer) {
  const int default_max_tokens = std::min(256, scheduler_.options().limits.max_tokens);
  serving::TurnRequest turn = FromProto(*request, default_max_tokens);
  if (turn.request_id.empty()) {
    // Unique per call, so Abort by request id and cancellation find exactly this turn.
    turn.request_id = absl::StrCat("w", reinterpret_cast<uintptr_t>(context));
  }
  const std::string request_id = turn.request_id;
  absl::StatusOr<std::shared_ptr<serving::TurnStream>> stream = scheduler_.Submit(std::move(turn));
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  serving::TurnUpdate u;
  while (true) {
    if (context->IsCancelled()) {
      scheduler_.AbortRequest(request_id);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the turn");
    }
    if (!(*stream)->Next(absl::Milliseconds(50), &u)) continue;
    if (!u.token_ids.empty() || !u.text.empty()) {
      v1::TurnEvent event;
      v1::TokenEvent* tokens = event.mutable_tokens();
      tokens->mutable_token_ids()->Add(u.token_ids.begin(), u.token_ids.end());
      tokens->mutable_logprobs()->Add(u.logprobs.begin(), u.logprobs.end());
      tokens->set_text(std::move(u.text));
      if (!writer->Write(event)) {  // the stream is gone
        scheduler_.AbortRequest(request_id);
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
    }
    if (!u.done) continue;
    if (serving::IsHistoryNeeded(u.status)) {
      v1::TurnEvent event;
      event.mutable_history_needed()->set_history_length(request->history_length());
      writer->Write(event);
    }
    if (!u.status.ok()) return ToGrpcStatus(u.status);
    v1::TurnEvent event;
    v1::TurnDone* done = event.mutable_done();
    const serving::TurnSummary& s = u.summary;
    done->set_finish_reason(ToProto(s.finish));
    done->mutable_usage()->set_prompt_tokens(s.prompt_tokens);
    done->mutable_usage()->set_cached_tokens(s.cached_tokens);
    done->mutable_usage()->set_generated_tokens(s.generated_tokens);
    done->set_kv_bytes(s.kv_bytes);
    done->set_peak_kv_bytes(s.peak_kv_bytes);
    done->set_evictions(s.evictions);
    done->set_evicted_tokens(s.evicted_tokens);
    done->set_rebuilt(s.rebuilt);
    if (!s.episode_windows.empty()) {
      v1::EpisodesReport* e = done->mutable_episodes();
      for (int w : s.episode_windows) e->add_windows(w);
      e->set_active(s.episode);
      e->set_replayed_tokens(s.replayed_tokens);
    }
    writer->Write(event);
    return grpc::Status::OK;
  }
}

grpc::Status WorkerService::DropSession(grpc::ServerContext*, const v1::DropSessionRequest* request,
                                        v1::DropSessionResponse* response) {
  if (request->session_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session_id: is required");
  }
  absl::StatusOr<int64_t> freed = scheduler_.DropSession(request->session_id());
  if (!freed.ok()) return ToGrpcStatus(freed.status());
  response->set_freed_bytes(*freed);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Abort(grpc::ServerContext*, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) {
  switch (request->target_case()) {
    case v1::AbortRequest::kRequestId:
      response->set_aborted(scheduler_.AbortRequest(request->request_id()));
      return grpc::Status::OK;
    case v1::AbortRequest::kSessionId:
      response->set_aborted(scheduler_.AbortSession(request->session_id()));
      return grpc::Status::OK;
    case v1::AbortRequest::kAll:
      if (!request->all()) break;
      response->set_aborted(scheduler_.AbortAll());
      return grpc::Status::OK;
    case v1::AbortRequest::TARGET_NOT_SET:
      break;
  }
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "target: set request_id, session_id or all = true");
}

grpc::Status WorkerService::GetLoad(grpc::ServerContext*, const v1::GetLoadRequest*,
                                    v1::LoadReport* response) {
  const serving::LoadSnapshot l = scheduler_.Load();
  response->set_kv_blocks_total(l.kv_blocks_total);
  response->set_kv_blocks_free(l.kv_blocks_free);
  response->set_kv_block_bytes(l.kv_block_bytes);
  response->set_active_turns(l.active_turns);
  response->set_queued_turns(l.queued_turns);
  response->set_resident_sessions(l.resident_sessions);
  response->set_offloaded_sessions(l.offloaded_sessions);
  response->set_tokens_per_second(l.tokens_per_second);
  response->set_host_bytes_used(l.host_bytes_used);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Info(grpc::ServerContext*, const v1::InfoRequest*,
                                 v1::InfoResponse* response) {
  const serving::SchedulerOptions& o = scheduler_.options();
  response->set_model(identity_.model);
  response->set_context_length(scheduler_.model().config.max_seq_len);
  response->set_tp_size(identity_.tp_size);
  for (const std::string& p : scheduler_.policies()) response->add_policies(p);
  v1::CacheSettings* c = response->mutable_default_cache();
  const serving::CacheDefaults& d = o.cache;
  c->set_policy(d.policy);
  if (d.budget_fraction.has_value()) {
    c->set_budget_fraction(static_cast<float>(*d.budget_fraction));
  } else {
    c->set_budget_tokens(d.budget_tokens);
  }
  c->set_window(d.window);
  c->set_alpha(static_cast<float>(d.alpha));
  c->set_tp_eviction(d.tp_eviction);
  if (d.positions.has_value()) c->set_positions(*d.positions);
  c->set_kv_dtype(kernels::KvDTypeName(scheduler_.kv_dtype()));
  if (d.policy == "episodic") {
    c->set_episodes(d.episodes);
    c->set_embedder(d.embedder);
    c->set_block_tokens(d.block_tokens);
    c->set_recluster_turns(d.recluster_turns);
  }
  response->set_max_tokens_limit(o.limits.max_tokens);
  response->set_chat_format(model::ChatFormatName(o.chat_format));
  response->set_vocab_size(scheduler_.model().config.vocab_size);
  response->set_version(identity_.version);
  return grpc::Status::OK;
}

}  // namespace recall::service
