// Scheduler: one batch. Building it (decode tokens first, then prefill chunks), making room
// for it, running the forward pass and the eviction steps on every rank, then per turn the
// bookkeeping, sampling and stop checks.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cpu/sampling.h"
#include "worker/runtime/positions.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/scheduler_turn.h"

namespace recall::serving {

absl::StatusOr<int> Scheduler::PlanFeed(Turn& t) {
  Session& s = *t.session;
  const model::ModelConfig& c = model_.config;
  const int remaining = t.decoding ? 1 : static_cast<int>(t.prompt.size() - t.fed);
  int n = t.decoding ? 1 : std::min(options_.prefill_chunk, remaining);
  t.stepping = false;
  if (!t.decoding) {
    // Replayed decode steps go one per step; a prefill chunk stops where they begin.
    for (const auto& [begin, end] : t.step_ranges) {
      if (t.fed >= end) continue;
      if (t.fed >= begin) {
        n = 1;
        t.stepping = true;
      } else {
        n = std::min<int>(n, static_cast<int>(begin - t.fed));
      }
      break;
    }
  }
  if (s.positions != runtime::Positions::kCompact) return n;
  cache::eviction::SessionEvictor* e = s.evictor();
  // The cache holds at most its budget, its window and one chunk: past that, prompt tokens go
  // one per step, each followed by an eviction step. (Not for a policy that compresses only
  // at prefill: stepping would not evict.)
  const bool can_step = e != nullptr && !e->policy().compresses_prefill();
  bool step = false;
  absl::StatusOr<int> piece = runtime::NextCompactPiece(
      *s.cache(), s.max_length(), c, !t.decoding && can_step ? e : nullptr, options_.prefill_chunk,
      n, &step, [&] { CompactSession(s); });
  if (!piece.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cache: ", piece.status().message()));
  }
  if (step) t.stepping = true;
  return *piece;
}

void Scheduler::CompactSession(Session& s) {
  const int32_t next = s.max_length();
  auto compact = [&](int r) {
    const runtime::ForwardPass& forward = *ranks_.ranks[static_cast<size_t>(r)].forward;
    runtime::CompactPositions(forward.backend(), forward.model().config,
                              *s.caches[static_cast<size_t>(r)], next);
    return absl::OkStatus();
  };
  if (ranks_.run_all == nullptr) {
    compact(0).IgnoreError();
  } else {
    ranks_.run_all(compact).IgnoreError();
  }
  metrics_->compactions->Increment();
}

void Scheduler::EnsureProbs(Turn& t, int len) {
  if (t.probs.empty() || t.probs_stride >= len) return;
  int64_t stride = std::max<int64_t>(64, t.probs_stride);
  while (stride < len) stride *= 2;
  t.probs_stride = std::min<int64_t>(stride, model_.config.max_seq_len);
  for (size_t r = 0; r < t.probs.size(); ++r) {
    const int rank_heads = ranks_.ranks[r].forward->model().config.n_heads;
    t.probs[r].assign(static_cast<size_t>(model_.config.n_layers) * rank_heads * t.probs_stride,
                      0.0f);
  }
}

void Scheduler::SettleScratch() {
  SessionMemory::RankBytes scratch(ranks_.ranks.size(), 0);
  auto add = [&scratch](const Turn& t) {
    auto bytes = [](const std::vector<float>& v) {
      return static_cast<int64_t>(v.capacity() * sizeof(float));
    };
    for (size_t r = 0; r < t.probs.size() && r < scratch.size(); ++r)
      scratch[r] += bytes(t.probs[r]);
    for (size_t r = 0; r < t.window_queries.size() && r < scratch.size(); ++r) {
      scratch[r] += bytes(t.window_queries[r]);
    }
    scratch[0] += bytes(t.raw_logits);
  };
  for (const auto& t : active_) add(*t);
  for (const auto& t : waiting_) add(*t);
  for (size_t r = 0; r < scratch.size(); ++r) {
    scratch[r] += ranks_.ranks[r].forward->probs_scratch_bytes();
  }
  memory_.SetScratch(std::move(scratch));
}

void Scheduler::RunBatch() {
  std::vector<runtime::BatchItem> items;
  std::vector<Turn*> owners;
  while (true) {
    items.clear();
    owners.clear();
    int budget = options_.max_batch_tokens;
    std::vector<std::pair<Turn*, absl::Status>> unplanned;
    // A token fed as a step (a decode step, or a prompt token of a stepping turn): its
    // attention probabilities go to the evictor.
    auto step_item = [&](Turn& t, const int32_t* token) {
      runtime::BatchItem item;
      item.cache = t.session->cache();
      item.tokens = token;
      item.n = 1;
      EnsureProbs(t, t.session->max_length() + 1);
      if (!t.probs.empty()) {
        item.attn_probs = t.probs[0].data();
        item.probs_stride = t.probs_stride;
      }
      const cache::eviction::SessionEvictor* e = t.session->evictor();
      item.probs_on_backend = e != nullptr && e->steps_on_backend();
      return item;
    };
    for (auto& t : active_) {
      t->chunk = 0;
      t->stepping = false;
      if (!t->decoding) continue;
      absl::StatusOr<int> n = PlanFeed(*t);
      if (!n.ok()) {
        unplanned.emplace_back(t.get(), n.status());
        continue;
      }
      runtime::BatchItem item = step_item(*t, &t->next);
      if (t->PicksOnBackend()) t->SetPick(item);
      t->chunk = 1;
      --budget;
      items.push_back(item);
      owners.push_back(t.get());
    }
    for (auto& t : active_) {
      if (t->decoding) continue;
      absl::StatusOr<int> planned = PlanFeed(*t);
      if (!planned.ok()) {
        unplanned.emplace_back(t.get(), planned.status());
        continue;
      }
      const int chunk = *planned;
      if (chunk > budget && !items.empty()) break;  // FIFO: later prefills wait their turn
      runtime::BatchItem item;
      if (t->stepping) {
        item = step_item(*t, t->prompt.data() + t->fed);
      } else {
        item.cache = t->session->cache();
        item.tokens = t->prompt.data() + t->fed;
        item.n = chunk;
      }
      item.want_logits = t->fed + chunk == t->prompt.size();
      if (item.want_logits && t->PicksOnBackend()) t->SetPick(item);
      if (t->window_w > 0 && !t->stepping) {
        item.window_queries = t->window_queries[0].data();
        item.window_w = t->window_w;
        item.window_first = t->window_first;
      }
      t->chunk = chunk;
      budget -= chunk;
      items.push_back(item);
      owners.push_back(t.get());
    }
    if (!unplanned.empty()) {
      for (auto& [t, status] : unplanned) FinishTurn(*t, status);
      if (active_.empty()) return;
      continue;  // plan again without them
    }
    // Blocks the batch appends on each rank (per layer, see SequenceCache::BlocksNeededFor);
    // Fits adds what the side memory lacks (grown probabilities, the last step's state).
    SettleScratch();
    RankBlocks need(ranks_.ranks.size(), 0);
    for (size_t i = 0; i < items.size(); ++i) {
      const Session& s = *owners[i]->session;
      for (size_t r = 0; r < need.size(); ++r) need[r] += s.caches[r]->BlocksNeededFor(items[i].n);
    }
    if (MakeRoom(need, nullptr)) break;
    if (!PreemptOne()) {
      // A single turn that outgrew the pool: end it rather than hang. Every other session
      // is already out of the pool (MakeRoom), so unless a preempted turn waiting to resume
      // still holds scratch there (counted by SettleScratch), the same turn would outgrow it
      // again: a retry hint sent clients back for nothing.
      const bool others_scratch = std::any_of(waiting_.begin(), waiting_.end(), [](const auto& w) {
        const auto held = [](const std::vector<float>& v) { return v.capacity() > 0; };
        return held(w->raw_logits) || std::any_of(w->probs.begin(), w->probs.end(), held) ||
               std::any_of(w->window_queries.begin(), w->window_queries.end(), held);
      });
      FinishTurn(*active_.back(),
                 absl::ResourceExhaustedError(absl::StrCat(
                     "the turn outgrew the KV pool: its session needs more than the pool's ",
                     memory_.PoolBlocks(), " blocks (", memory_.side_blocks(),
                     " of them holding the policies' state and the turns' scratch) with every "
                     "other session moved out",
                     others_scratch ? absl::StrCat(" but a paused turn's scratch; retry after ",
                                                   options_.retry_after_ms, " ms")
                                    : "; use a smaller cache.budget_tokens or cache.window, lower "
                                      "sampling.max_tokens or give the worker more KV memory (not "
                                      "retryable)")));
      if (active_.empty()) return;
    }
  }

  int n_logits = 0;
  int tokens = 0;
  for (const runtime::BatchItem& item : items) {
    n_logits += item.want_logits ? 1 : 0;
    tokens += item.n;
  }
  Stopwatch watch;
  std::vector<absl::Status> evict_status(items.size());
  absl::Status st = RunRanks(items, owners, evict_status);
  metrics_->step_seconds->Observe(watch.ElapsedSeconds());
  metrics_->batch_tokens->Observe(tokens);
  if (!st.ok()) {
    RECALL_LOG(ERROR) << "forward pass failed: " << st;
    for (Turn* t : owners) {
      t->worker_failed = true;
      FinishTurn(*t, st);
    }
    return;
  }
  const int64_t second = RealClock::Get().NowNanos() / 1000000000;
  if (token_seconds_.empty() || token_seconds_.back().first != second) {
    token_seconds_.emplace_back(second, 0);
  }
  token_seconds_.back().second += tokens;

  int li = 0;
  std::vector<std::pair<Turn*, absl::Status>> ended;
  for (size_t i = 0; i < items.size(); ++i) {
    Turn& t = *owners[i];
    float* logits = nullptr;
    if (items[i].want_logits) {
      logits = logits_.data() + static_cast<size_t>(li++) * model_.config.vocab_size;
    }
    if (!evict_status[i].ok()) {
      // The ranks' caches may disagree now (or the policy failed): end the turn loudly; its
      // cache is dropped and rebuilt from the transcript next time.
      RECALL_LOG(ERROR) << "eviction failed for session " << t.session->id << ": "
                        << evict_status[i];
      t.worker_failed = true;
      ended.emplace_back(&t, evict_status[i]);
      continue;
    }
    AfterForward(t, logits);
    if (t.done) ended.emplace_back(&t, absl::OkStatus());
  }
  for (auto& [t, status] : ended) FinishTurn(*t, status);
}

absl::Status Scheduler::RunRanks(std::span<const runtime::BatchItem> items,
                                 std::span<Turn* const> owners,
                                 std::vector<absl::Status>& evict_status) {
  // Item i's eviction work after the forward pass: a decode step, or the prompt compression
  // when its last prefill chunk ran. Decided here, once, for every rank.
  enum class Evict { kNone, kStep, kCompress };
  std::vector<Evict> work(items.size(), Evict::kNone);
  for (size_t i = 0; i < items.size(); ++i) {
    const Turn& t = *owners[i];
    if (t.session->evictors.empty()) continue;
    if (t.decoding || t.stepping) {
      work[i] = Evict::kStep;
    } else if (t.window_w > 0 && t.fed + t.chunk == t.prompt.size()) {
      work[i] = Evict::kCompress;
    }
  }
  // Per rank: its items (its caches and buffers) and the eviction errors of its items.
  std::vector<std::vector<absl::Status>> rank_status(ranks_.ranks.size(),
                                                     std::vector<absl::Status>(items.size()));
  // Per rank: the bytes each item's cache (and eviction state) holds after its new tokens
  // were stored and before any eviction: the step's peak (a policy evicts back to its budget
  // after it).
  std::vector<std::vector<int64_t>> held(ranks_.ranks.size(), std::vector<int64_t>(items.size()));
  auto run_rank = [&](int r) -> absl::Status {
    std::vector<runtime::BatchItem> mine(items.begin(), items.end());
    for (size_t i = 0; r > 0 && i < mine.size(); ++i) {
      Turn& t = *owners[i];
      mine[i].cache = t.session->caches[static_cast<size_t>(r)].get();
      if (mine[i].attn_probs != nullptr)
        mine[i].attn_probs = t.probs[static_cast<size_t>(r)].data();
      if (mine[i].window_queries != nullptr) {
        mine[i].window_queries = t.window_queries[static_cast<size_t>(r)].data();
      }
    }
    runtime::ForwardPass& forward = *ranks_.ranks[static_cast<size_t>(r)].forward;
    RECALL_RETURN_IF_ERROR(forward.Run(mine, r == 0 ? logits_.data() : nullptr));
    for (size_t i = 0; i < items.size(); ++i) {
      const std::vector<std::unique_ptr<cache::eviction::SessionEvictor>>& ev =
          owners[i]->session->evictors;
      held[static_cast<size_t>(r)][i] =
          mine[i].cache->bytes_held() +
          (ev.empty() ? 0 : ev[static_cast<size_t>(r)]->state_bytes());
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (work[i] == Evict::kNone) continue;
      const Turn& t = *owners[i];
      cache::eviction::SessionEvictor& e = *t.session->evictors[static_cast<size_t>(r)];
      absl::Status& status = rank_status[static_cast<size_t>(r)][i];
      if (work[i] == Evict::kCompress) {
        status = e.CompressPrefill(t.window_queries[static_cast<size_t>(r)].data(), t.window_w);
      } else if (mine[i].probs_on_backend) {
        int64_t stride = 0;
        const float* probs = forward.backend_probs(i, &stride);
        status = e.Step(probs, stride);
      } else {
        status = e.Step(t.probs.empty() ? nullptr : t.probs[static_cast<size_t>(r)].data(),
                        t.probs_stride);
      }
      int64_t& h = held[static_cast<size_t>(r)][i];
      if (status.ok()) h = std::max(h, e.step_peak_bytes());
    }
    return absl::OkStatus();
  };
  absl::Status st = ranks_.run_all == nullptr ? run_rank(0) : ranks_.run_all(run_rank);
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t bytes = 0;
    for (const auto& per_rank : held) bytes += per_rank[i];
    owners[i]->peak_kv_bytes = std::max(owners[i]->peak_kv_bytes, bytes);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    for (const auto& per_rank : rank_status) {
      if (!per_rank[i].ok()) {
        evict_status[i] = per_rank[i];
        break;
      }
    }
  }
  return st;
}

void Scheduler::AfterForward(Turn& t, float* logits) {
  Session& s = *t.session;
  t.peak_kv_bytes = std::max(t.peak_kv_bytes, s.bytes_held() + s.state_bytes());
  if (!t.decoding) {
    // An episode's replayed gap is already in the session's tokens.
    const size_t from = std::max(t.fed, static_cast<size_t>(t.n_replay));
    const size_t to = t.fed + t.chunk;
    if (to > from) {
      s.Feed(t.prompt.data() + from, t.prompt.data() + to,
             static_cast<size_t>(model_.config.max_seq_len));
    }
    t.fed += t.chunk;
    metrics_->prompt_tokens->Increment(t.chunk);
    // A replayed cut reply: its tokens after the cut go once fed, as its turn gave them back.
    if (t.next_give_back < t.give_backs.size() && t.fed == t.give_backs[t.next_give_back].second) {
      const auto [first, end] = t.give_backs[t.next_give_back++];
      s.Unfeed(static_cast<int>(end - first));
    }
    if (t.fed < t.prompt.size()) return;
    t.decoding = true;
    if (t.window_w > 0) {  // compressed by RunRanks
      s.prefill_compressed = true;
      t.window_w = 0;
      t.window_queries = {};
    }
    // The stream decoder continues after the prompt's last token.
    t.decoder = std::make_unique<model::TokenStreamDecoder>(tokenizer_);
    const size_t context_end = t.prompt.size() - t.n_resume;
    t.decoder->Next(t.prompt[context_end - 1]);
    t.decoder->Flush();
    // Resumed reply tokens: the client has them and the text the dead worker released for
    // them (the same StopText logic released the same text); what it held back is still
    // to come.
    for (size_t i = context_end; i < t.prompt.size(); ++i) {
      t.generated.push_back(t.prompt[i]);
      t.DecodeGenerated(t.prompt[i]);
    }
    t.stop_text.TakeReady();
    if (t.resume_stop >= 0) {  // the reply had ended at a stop string or the context (Prepare)
      t.generated.push_back(t.resume_stop);
      t.next = t.resume_stop;
      t.DecodeGenerated(t.resume_stop);
      t.stop_text.TakeReady();
      t.finish = t.resume_finish;
      t.done = true;
      return;
    }
  } else {
    s.Feed(&t.next, &t.next + 1,
           static_cast<size_t>(model_.config.max_seq_len));  // evicted after the pass by RunRanks
  }
  SampleNext(t, logits);
}

TokenLogprob Scheduler::Logprob(const Turn& t, int32_t id) const {
  const std::vector<float>& raw = t.raw_logits;
  const float max = *std::max_element(raw.begin(), raw.end());
  double sum = 0;
  for (float v : raw) sum += std::exp(static_cast<double>(v - max));
  const double log_z = max + std::log(sum);
  // The token before `id`: its bytes can depend on it (a SentencePiece space after BOS).
  const int32_t prev = !t.generated.empty() ? t.generated.back()
                       : t.prompt.empty()   ? -1
                                            : t.prompt.back();
  TokenLogprob lp;
  lp.logprob = static_cast<float>(raw[id] - log_z);
  lp.token = tokenizer_.TokenBytes(prev, id);
  const int top = std::min<int>(t.req.top_logprobs, static_cast<int>(raw.size()));
  if (top > 0) {
    // Most likely first; equal logits rank the lower id first (as the greedy pick).
    std::vector<int32_t> order(raw.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + top, order.end(),
        [&raw](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
    for (int i = 0; i < top; ++i) {
      lp.top_ids.push_back(order[i]);
      lp.top_logprobs.push_back(static_cast<float>(raw[order[i]] - log_z));
      lp.top_tokens.push_back(tokenizer_.TokenBytes(prev, order[i]));
    }
  }
  return lp;
}

void Scheduler::SampleNext(Turn& t, float* logits) {
  Session& s = *t.session;
  const int vocab = model_.config.vocab_size;
  // Logprobs are of the model's distribution (before temperature and the other sampling
  // transforms, which Sample applies in place).
  if (t.req.logprobs) t.raw_logits.assign(logits, logits + vocab);
  int32_t id;
  if (t.PicksOnBackend()) {
    id = t.picked;
    if (t.req.sampling.temperature > 0.0f) t.rng.NextFloat();  // the draw the pick used
  } else {
    kernels::cpu::ApplyReplyPenalties(logits, vocab, t.req.sampling, t.generated.data(),
                                      static_cast<int>(t.generated.size()));
    // The repetition penalty looks back over the session's last context length of tokens:
    // all of them within the context; past it (a compact session), a window as long as the
    // context, so that a step costs the same however long the session has run.
    const size_t seen = std::min(s.tokens.size(), static_cast<size_t>(model_.config.max_seq_len));
    id = ranks_.ranks[0].forward->backend().Sample(logits, vocab, t.req.sampling, t.rng,
                                                   s.tokens.data() + (s.tokens.size() - seen),
                                                   static_cast<int>(seen));
  }
  const double now = t.since_submit.ElapsedSeconds();
  if (t.first_token_s < 0) {
    t.first_token_s = now;
    metrics_->ttft->Observe(now);
  } else {
    metrics_->tpot->Observe(now - t.last_token_s);
  }
  t.last_token_s = now;
  if (std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(), id) !=
      options_.stop_token_ids.end()) {
    t.finish = TurnFinish::kStop;
    t.done = true;
    return;
  }
  TokenLogprob logprob;
  if (t.req.logprobs) logprob = Logprob(t, id);
  t.generated.push_back(id);
  t.next = id;
  metrics_->generated_tokens->Increment();
  const bool stopped = t.DecodeGenerated(id);
  t.stream->PushToken(id, t.stop_text.TakeReady(), t.req.logprobs ? &logprob : nullptr);
  if (stopped) {
    t.finish = TurnFinish::kStop;
    t.done = true;
    return;
  }
  if (static_cast<int>(t.generated.size()) >= t.req.max_tokens) {
    t.finish = TurnFinish::kLength;
    t.done = true;
  } else if ((s.positions == runtime::Positions::kOriginal &&
              s.cache()->next_position() >= model_.config.max_seq_len) ||
             (s.ends_at_context() && s.max_length() >= model_.config.max_seq_len)) {
    t.finish = TurnFinish::kContext;
    t.done = true;
  }
}

}  // namespace recall::serving
