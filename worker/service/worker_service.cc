#include "worker/service/worker_service.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/service/run_turn_reactor.h"

namespace recall::service {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

// A float of the wire as the decimal it was written as: 0.7f is 0.699999988, whose fraction
// of 10 tokens floors to 6 where the worker's own 0.7 gives 7. The shortest decimal that
// reads back as the float (to_chars) is that number.
double Widen(float f) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f);
  if (ec != std::errc()) return f;
  return std::strtod(std::string(buf, end).c_str(), nullptr);
}

std::vector<model::ChatMessage> Messages(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& in) {
  std::vector<model::ChatMessage> out;
  out.reserve(in.size());
  for (const v1::ChatMessage& m : in) out.push_back({m.role(), m.content()});
  return out;
}

}  // namespace

void ToProto(const serving::TakenBackTurn& taken, v1::TakenBackTurn* out) {
  out->mutable_token_ids()->Add(taken.token_ids.begin(), taken.token_ids.end());
  out->set_prompt_tokens(taken.prompt_tokens);
}

serving::TurnRequest FromProto(const v1::RunTurnRequest& r, int default_max_tokens) {
  serving::TurnRequest out;
  out.session_id = r.session_id();
  out.request_id = r.request_id();
  out.messages = Messages(r.messages());
  out.history_length = r.history_length();
  out.history = Messages(r.history());
  bool any_reply = false;
  for (const v1::ChatMessage& m : r.history()) any_reply = any_reply || m.token_ids_size() > 0;
  if (any_reply) {
    for (const v1::ChatMessage& m : r.history()) {
      std::optional<serving::ReplyRecord>& reply = out.history_replies.emplace_back();
      if (m.role() != "assistant" || m.finish_reason() == v1::FINISH_REASON_UNSPECIFIED) continue;
      reply.emplace();
      reply->token_ids.assign(m.token_ids().begin(), m.token_ids().end());
      reply->finish = m.finish_reason() == v1::FINISH_REASON_STOP ? serving::TurnFinish::kStop
                      : m.finish_reason() == v1::FINISH_REASON_CONTEXT
                          ? serving::TurnFinish::kContext
                          : serving::TurnFinish::kLength;
      for (const v1::TakenBackTurn& t : m.taken_back_after()) {
        reply->taken_back_after.push_back(
            {std::vector<int32_t>(t.token_ids().begin(), t.token_ids().end()), t.prompt_tokens()});
      }
    }
  }
  const v1::SamplingParams& s = r.sampling();
  if (s.has_temperature()) out.sampling.temperature = s.temperature();
  if (s.has_top_p()) out.sampling.top_p = s.top_p();
  if (s.has_top_k()) out.sampling.top_k = s.top_k();
  if (s.has_repetition_penalty()) out.sampling.repetition_penalty = s.repetition_penalty();
  if (s.has_frequency_penalty()) out.sampling.frequency_penalty = s.frequency_penalty();
  if (s.has_presence_penalty()) out.sampling.presence_penalty = s.presence_penalty();
  out.sampling.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(out.sampling.logit_bias.begin(), out.sampling.logit_bias.end());  // map order varies
  // Unset: a fresh seed, so two requests without one do not sample alike.
  out.sampling.seed = s.has_seed() ? s.seed() : std::random_device{}();
  out.max_tokens = s.has_max_tokens() ? s.max_tokens() : default_max_tokens;
  out.stop.assign(s.stop().begin(), s.stop().end());
  out.logprobs = s.has_logprobs() && s.logprobs();
  out.top_logprobs = s.has_top_logprobs() ? s.top_logprobs() : 0;
  out.resume_tokens.assign(r.resume_tokens().begin(), r.resume_tokens().end());
  out.rebuild = r.rebuild();
  out.cache = FromProto(r.cache());
  return out;
}

v1::CacheSettings ToProto(const serving::CacheDefaults& d) {
  v1::CacheSettings c;
  c.set_policy(d.policy);
  if (d.budget_fraction.has_value()) {
    c.set_budget_fraction(static_cast<float>(*d.budget_fraction));
  } else {
    c.set_budget_tokens(d.budget_tokens);
  }
  c.set_window(d.window);
  c.set_alpha(static_cast<float>(d.alpha));
  c.set_tp_eviction(d.tp_eviction);
  if (d.positions.has_value()) c.set_positions(*d.positions);
  if (d.policy == "episodic") {
    c.set_episodes(d.episodes);
    c.set_embedder(d.embedder);
    c.set_block_tokens(d.block_tokens);
    c.set_recluster_turns(d.recluster_turns);
  }
  return c;
}

serving::CacheRequest FromProto(const v1::CacheSettings& c) {
  serving::CacheRequest out;
  if (c.has_policy()) out.policy = c.policy();
  if (c.has_budget_tokens()) out.budget_tokens = c.budget_tokens();
  if (c.has_budget_fraction()) out.budget_fraction = Widen(c.budget_fraction());
  if (c.has_window()) out.window = c.window();
  if (c.has_alpha()) out.alpha = Widen(c.alpha());
  if (c.has_tp_eviction()) out.tp_eviction = c.tp_eviction();
  if (c.has_episodes()) out.episodes = c.episodes();
  if (c.has_embedder()) out.embedder = c.embedder();
  if (c.has_block_tokens()) out.block_tokens = c.block_tokens();
  if (c.has_recluster_turns()) out.recluster_turns = c.recluster_turns();
  if (c.has_positions()) out.positions = c.positions();
  if (c.has_kv_dtype()) out.kv_dtype = c.kv_dtype();
  return out;
}

WorkerService::WorkerService(serving::Scheduler& scheduler, WorkerIdentity identity,
                             grpcutil::ClusterCredential cluster)
    : scheduler_(scheduler), identity_(std::move(identity)), cluster_(std::move(cluster)) {}

namespace {
constexpr char kPort[] = "the worker's port";
}  // namespace

grpc::ServerUnaryReactor* WorkerService::Refused(grpc::CallbackServerContext* context) {
  grpc::Status st = cluster_.Check(*context, kPort);
  if (st.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(st);
  return reactor;
}

grpc::ServerWriteReactor<v1::TurnEvent>* WorkerService::RunTurn(
    grpc::CallbackServerContext* context, const v1::RunTurnRequest* request) {
  if (grpc::Status st = cluster_.Check(*context, kPort); !st.ok()) {
    return RunTurnReactor::Start(
        scheduler_, "", 0,
        absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message()));
  }
  const int default_max_tokens = std::min(256, scheduler_.options().limits.max_tokens);
  serving::TurnRequest turn = FromProto(*request, default_max_tokens);
  if (turn.request_id.empty()) {
    // Unique in the process (a call's address comes back for later calls), so Abort by
    // request id and cancellation find exactly this turn, never a later one.
    static std::atomic<uint64_t> next_id{0};
    turn.request_id = absl::StrCat("w", next_id.fetch_add(1, std::memory_order_relaxed));
  }
  std::string request_id = turn.request_id;
  return RunTurnReactor::Start(scheduler_, std::move(request_id), request->history_length(),
                               scheduler_.Submit(std::move(turn)));
}

grpc::ServerUnaryReactor* WorkerService::DropSession(grpc::CallbackServerContext* context,
                                                     const v1::DropSessionRequest* request,
                                                     v1::DropSessionResponse* response) {
  if (auto* refused = Refused(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->session_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session_id: is required"));
    return reactor;
  }
  // Finished on the engine thread once the drop is applied; `response` lives until then.
  scheduler_.DropSessionAsync(
      request->session_id(),
      [reactor, response](absl::StatusOr<int64_t> freed) {
        if (freed.ok()) response->set_freed_bytes(*freed);
        reactor->Finish(ToGrpcStatus(freed.status()));
      },
      request->if_idle());
  return reactor;
}

namespace {

// A request id the worker made (RunTurn without one): "w" and a number.
bool IsWorkerMadeId(const std::string& id) {
  if (id.size() < 2 || id[0] != 'w') return false;
  for (size_t i = 1; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9') return false;
  }
  return true;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  if (auto* refused = Refused(context)) return refused;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto answer = [reactor, response](int aborted) {
    response->set_aborted(aborted);
    reactor->Finish(grpc::Status::OK);
  };
  switch (request->target_case()) {
    case v1::AbortRequest::kRequestId:
      // A caller's id (the coordinator's are unique): an Abort that overtook its RunTurn
      // (they come on different calls) still ends that turn when it arrives. The worker's own
      // ids ("w" and a number) restart with the worker: not remembered. The answer says what
      // the turn gave back (it may have ended before, at its stream's cancel).
      scheduler_.AbortRequestAsync(
          request->request_id(),
          [this, answer, response, id = request->request_id()](int aborted) {
            if (const std::optional<serving::TakenBackTurn> t = scheduler_.TakeTakenBack(id)) {
              ToProto(*t, response->add_taken_back());
            }
            answer(aborted);
          },
          /*remember_unseen=*/!IsWorkerMadeId(request->request_id()));
      return reactor;
    case v1::AbortRequest::kSessionId:
      scheduler_.AbortSessionAsync(request->session_id(), answer);
      return reactor;
    case v1::AbortRequest::kAll:
      if (!request->all()) break;
      scheduler_.AbortAllAsync(answer);
      return reactor;
    case v1::AbortRequest::TARGET_NOT_SET:
      break;
  }
  reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "target: set request_id, session_id or all = true"));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::GetLoad(grpc::CallbackServerContext* context,
                                                 const v1::GetLoadRequest*,
                                                 v1::LoadReport* response) {
  if (auto* refused = Refused(context)) return refused;
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
  response->set_side_bytes(l.side_bytes);
  response->set_side_blocks(l.side_blocks);
  response->set_stopping(l.stopping);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::CheckSession(grpc::CallbackServerContext* context,
                                                      const v1::CheckSessionRequest* request,
                                                      v1::CheckSessionResponse* response) {
  if (auto* refused = Refused(context)) return refused;
  const serving::CacheRequest cache = FromProto(request->cache());
  const absl::StatusOr<int> tokens = scheduler_.CheckSession(cache, request->system_prompt());
  if (tokens.ok()) {
    response->set_system_prompt_tokens(*tokens);
    const serving::CacheDefaults resolved = scheduler_.options().cache.With(cache);
    v1::CacheSettings* out = response->mutable_resolved();
    *out = ToProto(resolved);
    // Unset, positions depend on the worker's flags: the session keeps what they gave here.
    out->set_positions(resolved.policy != "full" && resolved.positions != "original" ? "compact"
                                                                                     : "original");
    if (cache.kv_dtype.has_value()) out->set_kv_dtype(*cache.kv_dtype);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(tokens.status()));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Info(grpc::CallbackServerContext* context,
                                              const v1::InfoRequest*, v1::InfoResponse* response) {
  if (auto* refused = Refused(context)) return refused;
  const serving::SchedulerOptions& o = scheduler_.options();
  response->set_model(identity_.model);
  response->set_context_length(scheduler_.model().config.max_seq_len);
  response->set_tp_size(identity_.tp_size);
  for (const std::string& p : scheduler_.policies()) response->add_policies(p);
  *response->mutable_default_cache() = ToProto(o.cache);
  response->mutable_default_cache()->set_kv_dtype(kernels::KvDTypeName(scheduler_.kv_dtype()));
  response->set_max_tokens_limit(o.limits.max_tokens);
  response->set_chat_format(model::ChatFormatName(o.chat_format));
  response->set_vocab_size(scheduler_.model().config.vocab_size);
  response->set_weights(scheduler_.model().config.WeightsName());
  response->set_version(identity_.version);
  response->set_instance(identity_.instance);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace recall::service
