// Scheduler: construction, the thread-safe API, and metrics. The engine loop is in
// scheduler_step.cc, admission in scheduler_admit.cc; the sessions and where their caches
// live (pools, host memory, the host budget) are SessionMemory's (session_memory.h).
#include "worker/serving/scheduler.h"

#include <algorithm>
#include <future>

#include "absl/strings/str_cat.h"
#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/session_evictor.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/utf8.h"
#include "worker/serving/episode_builder.h"
#include "worker/serving/scheduler_turn.h"
#include "worker/serving/tp_ranks.h"

namespace recall::serving {

Scheduler::Metrics::Metrics(metrics::Registry* r) {
  if (r == nullptr) {
    owned = std::make_unique<metrics::Registry>();
    r = owned.get();
  }
  registry = r;
  const std::string turns = "recall_worker_turns_total";
  const std::string turns_help =
      "Turns ended, by outcome (refused: the request's own error or no room for it, as its "
      "status says; error: the worker failed)";
  finished_length = r->GetCounter(turns, turns_help, "outcome=\"length\"");
  finished_stop = r->GetCounter(turns, turns_help, "outcome=\"stop\"");
  finished_context = r->GetCounter(turns, turns_help, "outcome=\"context\"");
  failed = r->GetCounter(turns, turns_help, "outcome=\"error\"");
  refused = r->GetCounter(turns, turns_help, "outcome=\"refused\"");
  cancelled = r->GetCounter(turns, turns_help, "outcome=\"cancelled\"");
  rejected = r->GetCounter("recall_worker_rejected_turns_total",
                           "Turns refused because the waiting queue was full");
  prompt_tokens = r->GetCounter("recall_worker_prefill_tokens_total", "Prompt tokens prefilled");
  cached_tokens = r->GetCounter("recall_worker_cached_tokens_total",
                                "Prompt tokens reused from resident session caches");
  generated_tokens = r->GetCounter("recall_worker_generated_tokens_total", "Tokens generated");
  evictions = r->GetCounter("recall_worker_evictions_total",
                            "KV compactions of a (layer, KV head) by the eviction policy");
  evicted_tokens = r->GetCounter("recall_worker_evicted_tokens_total", "KV token slots evicted");
  offloads =
      r->GetCounter("recall_worker_offloads_total", "Idle session caches moved to host memory");
  restores =
      r->GetCounter("recall_worker_restores_total", "Session caches brought back from host memory");
  drops_memory = r->GetCounter("recall_worker_memory_drops_total",
                               "Idle session caches dropped to make room (rebuilt later)");
  preemptions = r->GetCounter("recall_worker_preemptions_total",
                              "Running turns paused to host memory to make room");
  const std::string episodes = "recall_worker_episode_sets_total";
  const std::string episodes_help = "Episode sets of episodic sessions built off the serving path";
  episodes_installed = r->GetCounter(episodes, episodes_help, "outcome=\"installed\"");
  episodes_failed = r->GetCounter(episodes, episodes_help, "outcome=\"failed\"");
  episodes_over_host = r->GetCounter(episodes, episodes_help, "outcome=\"over_host_budget\"");
  episode_switches = r->GetCounter("recall_worker_episode_switches_total",
                                   "Turns answered by another episode than the session's last");
  replayed_tokens = r->GetCounter("recall_worker_episode_replayed_tokens_total",
                                  "Tokens fed again to bring a routed episode up to date");
  rebuilds = r->GetCounter("recall_worker_rebuilds_total",
                           "Turns whose session cache was rebuilt from the transcript");
  taken_back = r->GetCounter("recall_worker_taken_back_turns_total",
                             "Aborted turns whose tokens were given back (the session's cache "
                             "kept as before the turn)");
  compactions = r->GetCounter("recall_worker_compactions_total",
                              "Session caches re-positioned at the model's context length");
  ttft = r->GetHistogram("recall_worker_time_to_first_token_seconds",
                         "From submit to the first generated token",
                         metrics::ExponentialBuckets(0.005, 2, 14));
  tpot = r->GetHistogram("recall_worker_time_per_output_token_seconds",
                         "Between consecutive generated tokens of a turn",
                         metrics::ExponentialBuckets(0.001, 2, 14));
  step_seconds = r->GetHistogram("recall_worker_step_seconds", "One batched forward step",
                                 metrics::ExponentialBuckets(0.001, 2, 14));
  batch_tokens = r->GetHistogram("recall_worker_batch_tokens", "Tokens per forward step",
                                 metrics::ExponentialBuckets(1, 2, 11));
}

absl::Status Scheduler::Validate(const SchedulerOptions& options) {
  if (options.max_batch_tokens < 1 || options.prefill_chunk < 1 ||
      options.prefill_chunk > options.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk (", options.prefill_chunk,
                     ") must be in [1, max_batch_tokens = ", options.max_batch_tokens, "]"));
  }
  if (options.max_active < 1 || options.max_queued < 0 || options.host_cache_bytes < 0) {
    return absl::InvalidArgumentError("max_active must be >= 1; max_queued, host bytes >= 0");
  }
  if (options.max_active > options.max_batch_tokens) {
    // Every running turn decodes a token a step: a step could not hold them all.
    return absl::InvalidArgumentError(absl::StrCat("max_active (", options.max_active,
                                                   ") must be <= max_batch_tokens (",
                                                   options.max_batch_tokens, ")"));
  }
  if (options.limits.max_tokens < 1) {
    return absl::InvalidArgumentError("limits.max_tokens must be >= 1");
  }
  if (options.episode_threads < 1) {
    return absl::InvalidArgumentError("episode_threads must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const model::Model& model,
                                                             kernels::Backend& backend,
                                                             cache::BlockPool& pool,
                                                             const model::Tokenizer& tokenizer,
                                                             const SchedulerOptions& options,
                                                             metrics::Registry* metrics) {
  RECALL_RETURN_IF_ERROR(Validate(options));
  auto forward = std::make_unique<runtime::ForwardPass>(
      model, backend,
      runtime::ForwardOptions{.max_batch_tokens = options.max_batch_tokens,
                              .batch_invariant = true,
                              .step_graphs = true});
  SchedulerRanks ranks;
  ranks.ranks.push_back({forward.get(), &pool, nullptr, 0});
  ranks.total_kv_heads = model.config.n_kv_heads;
  return Make(model, std::move(forward), std::move(ranks), tokenizer, options, metrics);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Make(
    const model::Model& model, std::unique_ptr<runtime::ForwardPass> own, SchedulerRanks ranks,
    const model::Tokenizer& tokenizer, const SchedulerOptions& options,
    metrics::Registry* metrics) {
  const int tp = static_cast<int>(ranks.ranks.size());
  RECALL_ASSIGN_OR_RETURN(CacheFactory caches,
                          CacheFactory::Create(options.cache, model.config, ranks.total_kv_heads,
                                               tp, ranks.ranks[0].pool->layout().dtype));
  SchedulerOptions resolved = options;
  resolved.cache = caches.defaults();  // the budget lowered to fit the model, if it was
  std::unique_ptr<Scheduler> s(new Scheduler(model, std::move(own), std::move(ranks), tokenizer,
                                             resolved, std::move(caches), metrics));
  RECALL_RETURN_IF_ERROR(s->CheckDefaultPolicy());
  return s;
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(runtime::Engine& engine,
                                                             const model::Tokenizer& tokenizer,
                                                             const SchedulerOptions& options,
                                                             metrics::Registry* metrics) {
  return Create(engine.model(), SchedulerRanksOf(engine), tokenizer, options, metrics);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const model::Model& model,
                                                             SchedulerRanks ranks,
                                                             const model::Tokenizer& tokenizer,
                                                             const SchedulerOptions& options,
                                                             metrics::Registry* metrics) {
  RECALL_RETURN_IF_ERROR(Validate(options));
  if (ranks.ranks.empty()) return absl::InvalidArgumentError("ranks: none given");
  if (ranks.ranks.size() > 1 && ranks.run_all == nullptr) {
    return absl::InvalidArgumentError("ranks: run_all is required for more than one rank");
  }
  for (size_t r = 0; r < ranks.ranks.size(); ++r) {
    const SchedulerRank& rank = ranks.ranks[r];
    if (rank.forward == nullptr || rank.pool == nullptr ||
        (ranks.ranks.size() > 1 && rank.comm == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks[", r, "]: forward, pool and (tp > 1) comm are required"));
    }
    if (rank.forward->max_batch_tokens() < options.max_batch_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks[", r, "]: the forward pass takes ", rank.forward->max_batch_tokens(),
          " tokens per step, less than max_batch_tokens = ", options.max_batch_tokens));
    }
    if (rank.pool->layout().n_layers != model.config.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("ranks[", r, "]: pool has ",
                                                     rank.pool->layout().n_layers,
                                                     " layers, the model ", model.config.n_layers));
    }
  }
  if (ranks.total_kv_heads <= 0) ranks.total_kv_heads = model.config.n_kv_heads;
  return Make(model, nullptr, std::move(ranks), tokenizer, options, metrics);
}

Scheduler::Scheduler(const model::Model& model, std::unique_ptr<runtime::ForwardPass> own_forward,
                     SchedulerRanks ranks, const model::Tokenizer& tokenizer,
                     const SchedulerOptions& options, CacheFactory caches,
                     metrics::Registry* registry)
    : model_(model),
      own_forward_(std::move(own_forward)),
      ranks_(std::move(ranks)),
      tokenizer_(tokenizer),
      options_([&] {
        SchedulerOptions o = options;
        o.limits.vocab_size = model.config.vocab_size;
        return o;
      }()),
      caches_(std::move(caches)),
      metrics_(std::make_unique<Metrics>(registry)),
      memory_(
          [&] {
            std::vector<cache::BlockPool*> pools;
            for (const SchedulerRank& r : ranks_.ranks) pools.push_back(r.pool);
            return pools;
          }(),
          options.host_cache_bytes,
          {.offloads = metrics_->offloads,
           .restores = metrics_->restores,
           .drops = metrics_->drops_memory}),
      episodes_(model, tokenizer, ranks_.ranks.size() == 1 ? ranks_.ranks[0].pool : nullptr,
                options.episode_threads, memory_,
                {.installed = metrics_->episodes_installed,
                 .failed = metrics_->episodes_failed,
                 .over_host = metrics_->episodes_over_host,
                 .switches = metrics_->episode_switches}) {
  memory_.set_on_drop([this](const Session& s) {
    if (s.episodic != nullptr) episodes_.Cancel(s.id);
  });
  logits_.resize(static_cast<size_t>(options.max_active) * model.config.vocab_size);
  {
    absl::MutexLock lock(&mu_);
    load_.kv_blocks_total = memory_.PoolBlocks();
    load_.kv_blocks_free = memory_.FreeBlocks();
    for (const SchedulerRank& r : ranks_.ranks) load_.kv_block_bytes += r.pool->block_bytes();
  }
  metrics::Registry* r = metrics_->registry;
  auto gauge = [&](const char* name, const char* help, auto field) {
    r->AddCallbackGauge(name, help, [this, field] { return static_cast<double>(Load().*field); });
  };
  gauge("recall_worker_kv_blocks_total", "KV blocks in the pool", &LoadSnapshot::kv_blocks_total);
  gauge("recall_worker_kv_blocks_free", "Free KV blocks", &LoadSnapshot::kv_blocks_free);
  gauge("recall_worker_active_turns", "Turns in the running batch", &LoadSnapshot::active_turns);
  gauge("recall_worker_queued_turns", "Turns waiting for memory", &LoadSnapshot::queued_turns);
  gauge("recall_worker_resident_sessions", "Session caches in the pool",
        &LoadSnapshot::resident_sessions);
  gauge("recall_worker_offloaded_sessions", "Session caches in host memory",
        &LoadSnapshot::offloaded_sessions);
  gauge("recall_worker_host_cache_bytes", "Host bytes of offloaded caches",
        &LoadSnapshot::host_bytes_used);
  gauge("recall_worker_side_bytes",
        "Policy state and turn scratch counted against the KV pool (bytes)",
        &LoadSnapshot::side_bytes);
  gauge("recall_worker_side_blocks", "KV blocks lent to cover the policy state and turn scratch",
        &LoadSnapshot::side_blocks);
  gauge("recall_worker_transcript_bytes",
        "Host bytes of the sessions' transcript and token copies (bounded per session)",
        &LoadSnapshot::transcript_bytes);
  gauge("recall_worker_tokens_per_second", "Tokens processed per second over the last 10 s",
        &LoadSnapshot::tokens_per_second);
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::StopTakingTurns() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  load_.stopping = true;
}

int Scheduler::NotRunning() const {
  return static_cast<int>(incoming_.size() + after_abort_.size()) + load_.queued_turns;
}

int Scheduler::TurnsNotDone() const {
  absl::MutexLock lock(&mu_);
  return NotRunning() + load_.active_turns;
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status Scheduler::CheckDefaultPolicy() const {
  if (options_.cache.policy == "episodic" && !episodes_.Supported()) {
    return absl::InvalidArgumentError(
        "default policy \"episodic\" runs on one CPU rank; this scheduler has tp > 1 or a GPU "
        "pool");
  }
  return absl::OkStatus();
}

std::vector<std::string> Scheduler::policies() const {
  std::vector<std::string> names = cache::eviction::PolicyNames();
  if (episodes_.Supported()) names.push_back("episodic");
  return names;
}

absl::StatusOr<int> Scheduler::CheckSession(const CacheRequest& cache,
                                            const std::string& system_prompt) const {
  RECALL_RETURN_IF_ERROR(ValidateCacheRequest(cache, policies()));
  RECALL_ASSIGN_OR_RETURN(const SessionCacheSpec spec, caches_.Resolve(cache, 0));
  if (system_prompt.empty()) return 0;
  if (!utf8::IsValid(system_prompt)) {
    return absl::InvalidArgumentError("system_prompt: is not valid UTF-8");
  }
  RECALL_ASSIGN_OR_RETURN(
      const std::string text,
      model::RenderChat(options_.chat_format, {{"system", system_prompt}}, false));
  const int tokens = static_cast<int>(tokenizer_.Encode(text, true).size());
  // A session that keeps its positions (or whose policy evicts at the first prompt only)
  // ends at the context length (one that compacts goes on past it): a system prompt that
  // fills it leaves no turn.
  if (spec.ends_at_context() && tokens >= model_.config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "system_prompt: ", tokens, " tokens; the model's context length is ",
        model_.config.max_seq_len, " and a session of policy ", spec.policy,
        " ends there: ", PastContextAdvice(spec.evictor.has_value() && spec.policy != "snapkv")));
  }
  return tokens;
}

absl::StatusOr<std::shared_ptr<TurnStream>> Scheduler::Submit(TurnRequest request) {
  RECALL_RETURN_IF_ERROR(ValidateTurnRequest(request, options_.limits, policies()));
  std::vector<std::string> stops = options_.stop_strings;
  stops.insert(stops.end(), request.stop.begin(), request.stop.end());
  absl::MutexLock lock(&mu_);
  if (stop_ || draining_) {
    return absl::UnavailableError(
        "the worker is shutting down (its running turns are ending); retryable");
  }
  if (!request.request_id.empty() && aborted_unseen_.erase(request.request_id) > 0) {
    aborted_unseen_order_.erase(
        std::find(aborted_unseen_order_.begin(), aborted_unseen_order_.end(), request.request_id));
    return absl::CancelledError(
        absl::StrCat("turn ", request.request_id, " was aborted before it arrived"));
  }
  // The session's turn is being aborted: it ends at the engine's next command check, and this
  // one waits for that beside the queue (Submit runs on a gRPC thread: it does not block).
  const bool after_abort = aborting_sessions_.count(request.session_id) > 0 &&
                           after_abort_.count(request.session_id) == 0;
  if (busy_sessions_.count(request.session_id) > 0 && !after_abort) {
    return absl::FailedPreconditionError(
        absl::StrCat("session_id: session \"", request.session_id,
                     "\" already has a turn running; send the next turn when it ends (retryable)"));
  }
  // Turns not running yet: those the batch has slots for start at the next step; the others
  // wait, at most max_queued of them. (max_active more were let wait, and the message counted
  // only those the engine had seen: "7 turns running and 0 waiting (queue limit 2)".)
  const int not_running = NotRunning();
  const int free_slots = std::max(0, options_.max_active - load_.active_turns);
  if (not_running >= options_.max_queued + free_slots) {
    metrics_->rejected->Increment();
    return absl::ResourceExhaustedError(
        absl::StrCat("the worker is full: ", load_.active_turns, " turns running and ", not_running,
                     " waiting (queue limit ", options_.max_queued, "); retry after ",
                     options_.retry_after_ms, " ms (retryable)"));
  }
  if (request.request_id.empty()) request.request_id = absl::StrCat("r", next_request_++);
  busy_requests_[request.request_id] = request.session_id;
  const std::string session_id = request.session_id;
  auto turn = std::make_shared<Turn>(std::move(request), std::move(stops));
  std::shared_ptr<TurnStream> stream = turn->stream;
  if (after_abort) {
    after_abort_[session_id] = std::move(turn);
  } else {
    busy_sessions_.insert(session_id);
    incoming_.push_back(std::move(turn));
  }
  return stream;
}

absl::StatusOr<int64_t> Scheduler::Post(Command command) {
  auto result = std::make_shared<std::promise<absl::StatusOr<int64_t>>>();
  std::future<absl::StatusOr<int64_t>> future = result->get_future();
  command.done = [result](absl::StatusOr<int64_t> r) { result->set_value(std::move(r)); };
  PostAsync(std::move(command));
  return future.get();
}

void Scheduler::PostAsync(Command command) {
  absl::MutexLock lock(&mu_);
  commands_.push_back(std::move(command));
}

int Scheduler::AbortRequest(const std::string& request_id) {
  return static_cast<int>(*Post({Command::Kind::kAbortRequest, request_id}));
}

int Scheduler::AbortSession(const std::string& session_id) {
  return static_cast<int>(*Post({Command::Kind::kAbortSession, session_id}));
}

int Scheduler::AbortAll() { return static_cast<int>(*Post({Command::Kind::kAbortAll, ""})); }

absl::StatusOr<int64_t> Scheduler::DropSession(const std::string& session_id) {
  return Post({Command::Kind::kDrop, session_id});
}

namespace {

// A command's result as a count of aborted turns (aborts never fail).
std::function<void(absl::StatusOr<int64_t>)> AsCount(std::function<void(int)> done) {
  if (!done) return nullptr;
  return [done = std::move(done)](absl::StatusOr<int64_t> n) { done(static_cast<int>(*n)); };
}

}  // namespace

void Scheduler::AbortRequestAsync(const std::string& request_id, std::function<void(int)> done,
                                  bool remember_unseen) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = busy_requests_.find(request_id); it != busy_requests_.end()) {
      aborting_sessions_.insert(it->second);
    } else if (remember_unseen && !request_id.empty() &&
               aborted_unseen_.insert(request_id).second) {
      aborted_unseen_order_.push_back(request_id);
      if (static_cast<int>(aborted_unseen_order_.size()) > kRememberedAborts) {
        aborted_unseen_.erase(aborted_unseen_order_.front());
        aborted_unseen_order_.pop_front();
      }
    }
  }
  PostAsync({Command::Kind::kAbortRequest, request_id, AsCount(std::move(done))});
}

void Scheduler::AbortSessionAsync(const std::string& session_id, std::function<void(int)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (busy_sessions_.count(session_id) > 0) aborting_sessions_.insert(session_id);
  }
  PostAsync({Command::Kind::kAbortSession, session_id, AsCount(std::move(done))});
}

void Scheduler::AbortAllAsync(std::function<void(int)> done) {
  PostAsync({Command::Kind::kAbortAll, "", AsCount(std::move(done))});
}

void Scheduler::DropSessionAsync(const std::string& session_id,
                                 std::function<void(absl::StatusOr<int64_t>)> done, bool if_idle) {
  PostAsync(
      {if_idle ? Command::Kind::kDropIfIdle : Command::Kind::kDrop, session_id, std::move(done)});
}

void Scheduler::WaitForEpisodeBuilds() const { episodes_.WaitIdle(); }

LoadSnapshot Scheduler::Load() const {
  absl::MutexLock lock(&mu_);
  LoadSnapshot l = load_;
  l.queued_turns += static_cast<int>(after_abort_.size());  // parked behind an aborted turn
  // The tokens of this second so far and of the kRateSeconds - 1 before it, at the time of
  // asking: an idle worker's rate falls to 0 within kRateSeconds.
  const int64_t second = RealClock::Get().NowNanos() / 1000000000;
  int64_t tokens = 0;
  for (const auto& [at, n] : rate_seconds_) tokens += at > second - kRateSeconds ? n : 0;
  l.tokens_per_second = static_cast<double>(tokens) / kRateSeconds;
  return l;
}

}  // namespace recall::serving
