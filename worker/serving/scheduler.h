// Scheduler: serves many conversation sessions on one model with continuous batching.
//
// One engine thread runs steps. Each step:
//   1. applies aborts and drops that arrived since the last step;
//   2. admits waiting turns (FIFO) whose memory fits: a turn needs the blocks of its new
//      tokens (plus its session's offloaded blocks, if any). To make room it offloads idle
//      sessions' caches to host memory (least recently used first), or drops them when the
//      host budget is full (they are rebuilt from the transcript on their next turn). When
//      nothing more can be freed the turn keeps waiting;
//   3. builds one batch: a decode token for every decoding turn, then whole prefill chunks
//      (prefill_chunk tokens, fixed boundaries per turn) while max_batch_tokens allows, so a
//      long prompt never stalls decoding sessions; at least one chunk per step;
//   4. before running, makes sure the pool can take the batch's new blocks (offloading idle
//      sessions, then preempting the most recently admitted turn to host memory: it resumes
//      later exactly where it was);
//   5. runs the forward pass (batch invariant: a session's greedy output does not depend
//      on what it is batched with), then per turn: eviction step, sampling, stop checks,
//      streaming, finishing.
//
// Tensor parallelism: the scheduler runs on SchedulerRanks (one rank, or every rank of a
// runtime::tp::TpGroup, see tp_ranks.h). A session then has one cache and one evictor per
// rank; every step runs the forward pass and the eviction steps on all ranks at once (their
// collectives meet), and the scheduler decides once for all of them: admission by the
// fullest rank's pool, sampling from rank 0's logits, offloading every rank's slice together.
//
// Turns of one session run one at a time (a second turn while one runs is
// FailedPrecondition). Submit and the control calls are thread safe; they hand work to the
// engine thread and never run model code themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/block_pool.h"
#include "cache/episodic/embedder.h"
#include "common/metrics/registry.h"
#include "kernels/backend.h"
#include "kernels/comm/communicator.h"
#include "worker/model/model.h"
#include "worker/runtime/engine.h"
#include "worker/runtime/forward.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/episode_serving.h"
#include "worker/serving/session.h"
#include "worker/serving/session_memory.h"
#include "worker/serving/turn_request.h"
#include "worker/serving/turn_stream.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::serving {

struct SchedulerOptions {
  int max_batch_tokens = 256;  // tokens per forward pass
  int prefill_chunk = 64;      // prompt tokens per chunk (<= max_batch_tokens)
  int max_active = 64;         // turns in the running batch at most
  int max_queued = 256;        // turns waiting for memory at most; past it, ResourceExhausted
  int64_t host_cache_bytes = int64_t{4} << 30;  // offloaded caches at most
  int retry_after_ms = 1000;                    // the hint in ResourceExhausted messages
  // Token ids of aborted turns kept for their Abort's answer (TakeTakenBack) at most: 32 MiB.
  int64_t taken_back_tokens = int64_t{8} << 20;
  TurnLimits limits;
  model::ChatFormat chat_format = model::ChatFormat::kPlain;
  std::vector<int32_t> stop_token_ids;    // end a reply (EOS, <|im_end|>, ...)
  std::vector<std::string> stop_strings;  // end a reply (the chat format's)
  // Session caches: the defaults of what a turn's CacheRequest leaves unset (cache_factory.h).
  // verify_tp_keep: every eviction step checks that all ranks kept the same tokens (a mismatch
  // fails the turn with Internal and drops the session's cache).
  CacheDefaults cache;
  int episode_threads = 1;  // CPU threads of the background builder of episodes
};

// One rank the scheduler runs on.
struct SchedulerRank {
  runtime::ForwardPass* forward = nullptr;  // with the rank's communicator when tp > 1
  cache::BlockPool* pool = nullptr;         // the rank's KV pool
  kernels::Communicator* comm = nullptr;    // null for one rank
  int kv_head_offset = 0;                   // the model-global index of the rank's KV head 0
};

struct SchedulerRanks {
  std::vector<SchedulerRank> ranks;
  int total_kv_heads = 0;  // the model's KV heads
  // Calls fn(r) for every rank at once (each rank on its own thread) and waits for all;
  // returns the first error. Null for one rank (fn(0) is called directly).
  std::function<absl::Status(const std::function<absl::Status(int)>&)> run_all;
};

struct LoadSnapshot {
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_block_bytes = 0;
  int active_turns = 0;
  int queued_turns = 0;  // waiting for memory, or behind their session's aborted turn
  int resident_sessions = 0;
  int offloaded_sessions = 0;
  double tokens_per_second = 0;  // prefill + decode tokens of the last 10 s, per second
  int64_t host_bytes_used = 0;
  // Policy state and turns' scratch counted against the pool (SessionMemory's side memory),
  // and the blocks lent to cover them (in kv_blocks_total, not in kv_blocks_free).
  int64_t side_bytes = 0;
  int64_t side_blocks = 0;
  // The sessions' copies of their transcripts and tokens in host memory (Session::
  // transcript_bytes): bounded per session whatever its length (episodic ones excepted).
  int64_t transcript_bytes = 0;
  bool stopping = false;  // StopTakingTurns
};

class Scheduler {
 public:
  // The model, backend, pool and tokenizer must outlive the scheduler. `metrics` may be
  // null. InvalidArgument for bad options. Its forward pass is batch invariant and records
  // decode steps as graphs where the backend can (the worker's defaults).
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const model::Model& model,
                                                           kernels::Backend& backend,
                                                           cache::BlockPool& pool,
                                                           const model::Tokenizer& tokenizer,
                                                           const SchedulerOptions& options,
                                                           metrics::Registry* metrics = nullptr);
  // On an engine's ranks (the worker's way: worker/runtime/engine.h); `engine` must outlive
  // the scheduler.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(runtime::Engine& engine,
                                                           const model::Tokenizer& tokenizer,
                                                           const SchedulerOptions& options,
                                                           metrics::Registry* metrics = nullptr);
  // On several ranks (a tensor-parallel group): `model` is the full model (its config), the
  // ranks' forward passes must take options.max_batch_tokens tokens. The ranks (and what
  // they refer to) must outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const model::Model& model,
                                                           SchedulerRanks ranks,
                                                           const model::Tokenizer& tokenizer,
                                                           const SchedulerOptions& options,
                                                           metrics::Registry* metrics = nullptr);
  ~Scheduler();  // aborts every turn (their streams end with Cancelled) and stops the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a turn. InvalidArgument for a bad request (see ValidateTurnRequest);
  // FailedPrecondition when the session already has a turn running or waiting, unless that
  // turn is being aborted (its client left: the coordinator may send the session's next turn
  // before the abort reached the batch): then this one is queued when the aborted one ends
  // (one such turn per session; Submit does not wait, it runs on a gRPC callback thread);
  // ResourceExhausted (retryable, with a hint) when the waiting queue is full. Errors found
  // later (session not resident without history, a turn longer than the context, a turn
  // that can never fit the pool) end the stream with that status before any token.
  absl::StatusOr<std::shared_ptr<TurnStream>> Submit(TurnRequest request);

  // Abort running or waiting turns; their streams end with Cancelled (a partial reply is not
  // part of the transcript): a session that continued its cache gets back the cache it had
  // before the turn, less what an evicting policy's steps evicted (TakeBack; where that
  // cannot be, its cache is dropped). Returns how many.
  int AbortRequest(const std::string& request_id);
  int AbortSession(const std::string& session_id);
  int AbortAll();

  // Frees a session's cache (resident or offloaded); a running turn of it is aborted.
  // Returns the device bytes freed; NotFound if the scheduler does not hold the session.
  absl::StatusOr<int64_t> DropSession(const std::string& session_id);

  // The control calls above wait for the engine thread to apply them (before its next
  // step). These forms return at once, for callers that must not block (gRPC reactions):
  // `done`, when given, gets the same result on the engine thread once the command is
  // applied; it must not block or call the waiting forms.
  // With `remember_unseen`, an id that names no turn yet is remembered (the last
  // kRememberedAborts of them) and a turn submitted with it later is refused (Cancelled): the
  // abort overtook its turn (they come on different calls). For ids that are never reused
  // (the coordinator's); the worker's own ids ("w...", "r...") are not.
  void AbortRequestAsync(const std::string& request_id, std::function<void(int)> done = nullptr,
                         bool remember_unseen = false);
  static constexpr int kRememberedAborts = 4096;
  // What the aborted turn `request_id` of a session that evicts fed and gave back (TakeBack,
  // TakeBackFinished), once: none when it fed nothing, had its cache dropped, or was asked for
  // already. The last kRememberedAborts records are kept, and at most
  // SchedulerOptions::taken_back_tokens tokens in all, the newest record at least (one not
  // collected, its session rebuilds: Uncollected). Any thread; for an Abort's answer.
  std::optional<TakenBackTurn> TakeTakenBack(const std::string& request_id);
  void AbortSessionAsync(const std::string& session_id, std::function<void(int)> done = nullptr);
  void AbortAllAsync(std::function<void(int)> done = nullptr);
  // With `if_idle`, a session with a turn running or waiting is kept (FailedPrecondition): a
  // stale copy's drop that must not end a turn that came since.
  void DropSessionAsync(const std::string& session_id,
                        std::function<void(absl::StatusOr<int64_t>)> done, bool if_idle = false);

  // Blocks until the background builder of episodes (policy "episodic") has nothing queued
  // or building; returns at once when it was never started. For tests and benchmarks.
  void WaitForEpisodeBuilds() const;

  LoadSnapshot Load() const;
  // A worker stopping (SIGTERM) takes no new turn while its running and waiting ones end:
  // Submit is UNAVAILABLE from then on (retryable: the coordinator tries another worker).
  void StopTakingTurns();
  // Turns submitted and not ended: running, waiting, and those the engine has not seen yet.
  int TurnsNotDone() const;
  std::vector<std::string> policies() const;
  // Whether a new session with `cache` and `system_prompt` ("" for none) can be served here:
  // InvalidArgument naming the field ("cache.window", "system_prompt") as its first turn
  // would be refused; else the system prompt's tokens. Any thread; nothing is kept.
  absl::StatusOr<int> CheckSession(const CacheRequest& cache,
                                   const std::string& system_prompt) const;
  // How the pools store K and V (every rank alike).
  kernels::KvDType kv_dtype() const { return ranks_.ranks[0].pool->layout().dtype; }
  const SchedulerOptions& options() const { return options_; }
  const model::Model& model() const { return model_; }
  int tp() const { return static_cast<int>(ranks_.ranks.size()); }

 private:
  struct Turn;     // a queued or running turn (scheduler.cc)
  struct Command;  // abort / drop, applied by the engine thread

  Scheduler(const model::Model& model, std::unique_ptr<runtime::ForwardPass> own_forward,
            SchedulerRanks ranks, const model::Tokenizer& tokenizer,
            const SchedulerOptions& options, CacheFactory caches, metrics::Registry* metrics);
  static absl::Status Validate(const SchedulerOptions& options);
  // Checks the options and makes the cache factory (InvalidArgument naming the field).
  static absl::StatusOr<std::unique_ptr<Scheduler>> Make(const model::Model& model,
                                                         std::unique_ptr<runtime::ForwardPass> own,
                                                         SchedulerRanks ranks,
                                                         const model::Tokenizer& tokenizer,
                                                         const SchedulerOptions& options,
                                                         metrics::Registry* metrics);
  absl::Status CheckDefaultPolicy() const;  // "episodic" needs episodes_.Supported()

  // Hands a command to the engine thread and waits for its result.
  absl::StatusOr<int64_t> Post(Command command);
  // Hands a command to the engine thread; its `done` gets the result there.
  void PostAsync(Command command);

  // Engine thread (scheduler_step.cc).
  void Loop();
  bool Step();  // false when idle
  void ApplyCommands();
  void Admit();
  absl::Status Prepare(Turn& turn);         // PrepareContext, then the resumed reply tokens
  absl::Status PrepareContext(Turn& turn);  // session lookup, prompt tokens, context check
  void RunBatch();
  // A compact session's turn before a step (runtime/positions.h): how many tokens it feeds
  // now (a prefill chunk, or one token with an eviction step after it, so its cache stays
  // within its budget, its window and one chunk), re-positioning its cache first when they
  // would pass the context length. Sets t.stepping. 0 and an error when the cache cannot take
  // even one token (its policy does not evict while decoding).
  absl::StatusOr<int> PlanFeed(Turn& turn);
  // Re-positions every rank's cache of the session compactly (the next position agreed
  // across ranks).
  void CompactSession(Session& s);
  // Grows turn.probs so each rank's rows hold `len` slots.
  void EnsureProbs(Turn& turn, int len);
  // Counts the queued and running turns' scratch (probabilities, SnapKV's window, logits; a
  // device rank's probabilities scratch) against the pools with the sessions' state
  // (SessionMemory's side memory).
  void SettleScratch();
  // The forward pass and then the eviction work of the batch on every rank (rank r's thread);
  // evict_status[i] gets item i's eviction error, if any.
  absl::Status RunRanks(std::span<const runtime::BatchItem> items, std::span<Turn* const> owners,
                        std::vector<absl::Status>& evict_status);
  void AfterForward(Turn& turn, float* logits);
  void SampleNext(Turn& turn, float* logits);  // logits are overwritten
  // The logprob of `id` (and turn.req.top_logprobs alternatives) from turn.raw_logits.
  TokenLogprob Logprob(const Turn& turn, int32_t id) const;
  void FinishTurn(Turn& turn, absl::Status status);
  // After a reply cut at a stop string: gives back the tokens fed after the cut
  // (Session::Unfeed) and keeps the text the cut left of them for the next turn (replay.h
  // plans the same).
  void CutAtStop(Turn& turn);
  // After an aborted turn (its client left): gives back every token it fed and returns true.
  // Without eviction the session's cache is then exactly what it was before the turn; with
  // it, what the turn's steps evicted stays, and the turn's tokens are kept for the Abort's
  // answer (TakeTakenBack), so a rebuild feeds them and gives them back alike (replay.h).
  // False where that cannot be (episodes, a rebuild, a cache not resident; where the session
  // evicts, also a policy that compresses at prefill, a failover's resume, a turn stopped in
  // its prompt, a session with no reply yet): the caller drops the cache, and the next turn
  // rebuilds it from the transcript.
  bool TakeBack(Turn& turn);
  // Takes back `s`'s last turn after its end, as TakeBack would have before it, while the
  // session fed nothing since (Session::last_turn): for an Abort by its request id that came
  // after its end (the reply ran out as its client left; the session has no turn now), and
  // for a turn whose history is the transcript before it (a regenerate; a session without
  // eviction only). Whether it did.
  bool TakeBackFinished(Session& s);
  // What both give back: the tokens fed since `fed_before` (`prompt_fed` of them the turn's
  // prompt), noted for the Abort's answer where the session evicts; false where that cannot
  // be exact (`replayable`: the turn was its whole prompt, then decode steps, after a reply).
  bool GiveBack(Session& s, const std::string& request_id, int64_t fed_before, int64_t prompt_fed,
                bool replayable);
  // Whether the session took a turn back whose record no Abort's answer collected (then its
  // next turn rebuilds it: the transcript lacks the record); forgets it.
  bool Uncollected(const std::string& session_id);
  void EndTurn(Turn& turn);  // removes it from active_, frees the session's busy flag

  // Admission (scheduler_admit.cc); where session caches live is memory_'s (session_memory.h).
  using RankBlocks = SessionMemory::RankBlocks;
  RankBlocks BlocksToAdmit(const Turn& turn) const;
  // The error of a turn whose cache cannot fit the whole pool even at its end (the session
  // keeps every token: no evictor; what is cached, the rest of the prompt and max_tokens, up
  // to the context), or OK. ResourceExhausted, not retryable.
  absl::Status CheckPeakFits(const Turn& turn) const;
  // memory_.MakeRoom sparing the running turns' sessions and `keep`.
  bool MakeRoom(const RankBlocks& need, const Session* keep);
  bool PreemptOne();
  absl::Status EnsureResident(Turn& turn);
  absl::Status CreateCache(Session& s, const Turn& turn);
  // An episodic session's continuing turn: episodes_.BeginTurn, then the tokens the episode
  // in use has not seen go before the prompt.
  absl::Status PrepareEpisodes(Turn& turn);

  // Summed over the session's ranks.
  static int64_t TotalEvictions(const Session& s);
  static int64_t TotalEvictedSlots(const Session& s);

  const model::Model& model_;
  std::unique_ptr<runtime::ForwardPass> own_forward_;  // the one-rank Create's
  const SchedulerRanks ranks_;
  const model::Tokenizer& tokenizer_;
  const SchedulerOptions options_;
  const CacheFactory caches_;

  // Shared with submitters.
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Turn>> incoming_ ABSL_GUARDED_BY(mu_);
  std::vector<Command> commands_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> busy_sessions_ ABSL_GUARDED_BY(mu_);
  // The busy sessions' turns by request id, and the sessions whose turn an abort was asked
  // for (its client left): a next turn of such a session waits for the abort (Submit).
  std::map<std::string, std::string> busy_requests_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> aborting_sessions_ ABSL_GUARDED_BY(mu_);
  // Per aborting session, its next turn: queued (busy) when the aborted turn ends (FinishTurn);
  // in busy_requests_ already, so an abort finds it.
  std::map<std::string, std::shared_ptr<Turn>> after_abort_ ABSL_GUARDED_BY(mu_);
  // Aborted request ids that named no turn yet (AbortRequestAsync's remember_unseen), oldest
  // first, at most kRememberedAborts.
  std::set<std::string> aborted_unseen_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> aborted_unseen_order_ ABSL_GUARDED_BY(mu_);
  // TakeTakenBack's records by request id, and their ids oldest first.
  absl::Mutex taken_back_mu_;
  struct TakenBack {
    std::string session_id;
    TakenBackTurn turn;
  };
  std::map<std::string, TakenBack> taken_back_ ABSL_GUARDED_BY(taken_back_mu_);
  // Sessions with a record in taken_back_ not collected yet (Uncollected).
  std::set<std::string> uncollected_ ABSL_GUARDED_BY(taken_back_mu_);
  std::deque<std::string> taken_back_order_ ABSL_GUARDED_BY(taken_back_mu_);
  int64_t taken_back_tokens_ ABSL_GUARDED_BY(taken_back_mu_) = 0;  // in taken_back_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // StopTakingTurns
  // Turns submitted and not running yet: incoming, behind an abort, waiting.
  int NotRunning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t next_request_ ABSL_GUARDED_BY(mu_) = 0;
  LoadSnapshot load_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> rate_seconds_ ABSL_GUARDED_BY(mu_);  // token_seconds_

  // Engine thread only.
  std::deque<std::shared_ptr<Turn>> waiting_;
  std::vector<std::shared_ptr<Turn>> active_;
  std::vector<float> logits_;
  int64_t step_ = 0;
  // Tokens processed per whole second (second, tokens), the last kRateSeconds + 1 of them:
  // published at each step into rate_seconds_, which Load() sums at the time it is asked (an
  // idle worker's rate kept the value of its last step).
  static constexpr int kRateSeconds = 10;
  std::deque<std::pair<int64_t, int64_t>> token_seconds_;

  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
  SessionMemory memory_;     // engine thread only
  EpisodeServing episodes_;  // engine thread only (but WaitIdle)
  std::thread thread_;
};

}  // namespace recall::serving
