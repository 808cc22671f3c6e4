// Scheduler internals shared by scheduler*.cc: a turn's state while queued or running, the
// commands other threads hand to the engine thread, and the metrics it updates.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/metrics/registry.h"
#include "kernels/sampling_params.h"
#include "worker/runtime/forward.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/stop_text.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::serving {

struct Scheduler::Turn {
  Turn(TurnRequest r, std::vector<std::string> stops)
      : req(std::move(r)), rng(req.sampling.seed), stop_text(std::move(stops)) {}

  TurnRequest req;
  std::shared_ptr<TurnStream> stream = std::make_shared<TurnStream>();
  Stopwatch since_submit;

  // Set by Prepare.
  bool prepared = false;
  Session* session = nullptr;
  std::vector<int32_t> prompt;  // tokens fed this turn before generating (resume included)
  int n_resume = 0;             // of them, the reply tokens the client already has
  int32_t resume_stop = -1;     // a resumed token that ended the reply (not fed): a stop
                                // string's last, or the one sampled at the context's end
  TurnFinish resume_finish = TurnFinish::kStop;  // how the reply ended, with resume_stop
  int n_replay = 0;             // leading tokens the session has already (an episode's gap)
  int cached_tokens = 0;
  int prompt_tokens = 0;
  bool rebuilt = false;
  // Continues the session's cache (not a rebuild); at its first admission, what the session
  // held before it (an aborted turn gives back what it fed: Scheduler::TakeBack).
  bool continues = false;
  // Messages of the request's history that the session's copy lacked, continued before the
  // turn's own (PrepareContext); added to its transcript with them.
  std::vector<model::ChatMessage> caught_up;
  int64_t fed_before = 0;
  std::vector<int32_t> pending_before;
  std::string reply_tail_before;

  // Running.
  bool touched = false;  // admitted at least once: the session's cache holds this turn
  // Ended by the worker's own failure (a forward pass, a restore): counted as an error
  // whatever its status code (a device out of memory is RESOURCE_EXHAUSTED too).
  bool worker_failed = false;
  bool dropped = false;  // ended by its session's drop (NOT_FOUND): counted as cancelled
  int64_t admitted_at = 0;
  size_t fed = 0;  // prompt tokens fed
  int chunk = 0;   // tokens of this turn in the current batch
  // Prompt tokens fed one per step with an eviction step after each, as decode steps are:
  // a compact session whose prompt would grow its cache past its budget, its window and one
  // prefill chunk (Scheduler::PlanFeed).
  bool stepping = false;
  // Prompt tokens the session's history fed as decode steps (an exact rebuild, replay.h; a
  // failover's resume tokens): [begin, end) ranges of `prompt`, in order, fed one per step.
  std::vector<std::pair<size_t, size_t>> step_ranges;
  bool decoding = false;
  int32_t next = -1;  // sampled and to be fed at the next step
  std::vector<int32_t> generated;
  kernels::Rng rng;
  std::unique_ptr<model::TokenStreamDecoder> decoder;
  StopText stop_text;
  // Per generated token: the bytes of reply text decoded through it, or -1 where the decoder
  // then held part of a character (TokensBeforeCut).
  std::vector<int64_t> text_ends;
  int64_t text_bytes = 0;
  // An exact rebuild's runs of prompt tokens to give back once fed ([first, end),
  // ReplayPlan::give_backs) and the next one due.
  std::vector<std::pair<size_t, size_t>> give_backs;
  size_t next_give_back = 0;
  // Prompt tokens still to be given back once fed (the cache holds that many fewer at the
  // end of the prompt), and the most at once (what it holds in passing).
  size_t GivenBack() const {
    size_t n = 0;
    for (size_t i = next_give_back; i < give_backs.size(); ++i) {
      n += give_backs[i].second - give_backs[i].first;
    }
    return n;
  }
  size_t LargestGiveBack() const {
    size_t n = 0;
    for (size_t i = next_give_back; i < give_backs.size(); ++i) {
      n = std::max(n, give_backs[i].second - give_backs[i].first);
    }
    return n;
  }
  // The prompt tokens still to feed that the cache will hold (at least in passing).
  int PromptToHold() const {
    const int64_t left = static_cast<int64_t>(prompt.size() - fed);
    const int64_t held = left - static_cast<int64_t>(GivenBack() - LargestGiveBack());
    return static_cast<int>(std::clamp<int64_t>(held, 0, left));
  }
  // Decodes generated token `id`, notes where its text ends and appends it to stop_text.
  // Returns whether a stop string occurred.
  bool DecodeGenerated(int32_t id) {
    const std::string piece = decoder->Next(id);
    text_bytes += static_cast<int64_t>(piece.size());
    text_ends.push_back(decoder->holding() ? -1 : text_bytes);
    return stop_text.Append(piece);
  }
  TurnFinish finish = TurnFinish::kLength;
  bool done = false;
  std::vector<float> raw_logits;  // when logprobs are requested
  // Without a repetition penalty or logprobs, the forward pass picks the token where the
  // logits are (runtime::BatchItem::pick) and only its id crosses to the host. The draw is the one
  // Sample would take from rng; SampleNext then advances rng past it, so a seed gives the
  // same stream of draws either way.
  bool PicksOnBackend() const { return kernels::SamplesOnBackend(req.sampling) && !req.logprobs; }
  float PeekDraw() const {
    kernels::Rng next = rng;
    return next.NextFloat();
  }
  int32_t picked = -1;
  void SetPick(runtime::BatchItem& item) {
    item.pick = &picked;
    item.sampling = &req.sampling;
    item.draw = PeekDraw();
  }
  // Per rank (its query heads): attention probabilities for the evictor, and SnapKV's
  // observation window. Empty when the policy needs none.
  std::vector<std::vector<float>> probs;
  int64_t probs_stride = 0;  // floats per query head in probs: >= the cache's length + 1
  std::vector<std::vector<float>> window_queries;
  int window_w = 0;
  int window_first = 0;
  int64_t peak_kv_bytes = 0;
  int64_t evictions_at_start = 0;
  int64_t evicted_at_start = 0;
  double first_token_s = -1;
  double last_token_s = -1;
};

struct Scheduler::Command {
  // kDropIfIdle: kDrop unless a turn of the session runs or waits (FailedPrecondition then).
  enum class Kind { kAbortRequest, kAbortSession, kAbortAll, kDrop, kDropIfIdle };
  Kind kind;
  std::string key;
  // Gets the result on the engine thread once the command is applied; may be empty.
  std::function<void(absl::StatusOr<int64_t>)> done = nullptr;
};

struct Scheduler::Metrics {
  explicit Metrics(metrics::Registry* r);

  std::unique_ptr<metrics::Registry> owned;  // when the caller gave none
  metrics::Registry* registry;
  metrics::Counter* finished_length;
  metrics::Counter* finished_stop;
  metrics::Counter* finished_context;
  metrics::Counter* failed;   // the worker's own failure (a forward pass, a restore, ...)
  metrics::Counter* refused;  // the turn's own fault or no room (RefusedTurn)
  metrics::Counter* cancelled;
  metrics::Counter* rejected;
  metrics::Counter* prompt_tokens;  // tokens prefilled
  metrics::Counter* cached_tokens;  // prompt tokens reused from resident caches
  metrics::Counter* generated_tokens;
  metrics::Counter* evictions;
  metrics::Counter* evicted_tokens;
  metrics::Counter* offloads;
  metrics::Counter* restores;
  metrics::Counter* drops_memory;
  metrics::Counter* preemptions;
  metrics::Counter* episodes_installed;
  metrics::Counter* episodes_failed;
  metrics::Counter* episodes_over_host;
  metrics::Counter* episode_switches;
  metrics::Counter* replayed_tokens;
  metrics::Counter* rebuilds;
  metrics::Counter* taken_back;  // aborted turns given back (Scheduler::TakeBack)
  metrics::Counter* compactions;
  metrics::Histogram* ttft;
  metrics::Histogram* tpot;
  metrics::Histogram* step_seconds;
  metrics::Histogram* batch_tokens;
};

}  // namespace recall::serving
