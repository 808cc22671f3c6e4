// SessionEvictor: applies one EvictionPolicy to one sequence's SequenceCache, step by step.
//
// Owns the per-(layer, KV head) HeadStates (one per layer for layer_shared() policies), the
// per-layer budgets (BudgetAllocator) and all scratch. Usage in the decode loop, after the
// forward pass appended the step's token and filled BatchItem::attn_probs:
//
//   RECALL_RETURN_IF_ERROR(evictor->Step(probs, stride));   // may compact + trim the cache
//
// Step(probs, stride):
//   1. t = ++step (t = 1 at the first call: the first decode step after prefill).
//   2. Brings every state up to the cache length: slots appended since the last step
//      (the whole prompt at t = 1) get AppendSlots(.., t), i.e. ts = t - 1.
//   3. Per layer l with budget C_l (BudgetAllocator over next_position()):
//      - per-KV-head policies: p = ReduceGqaMax over the layer's query heads (max over the
//        G heads of each KV head's group); Observe; if ShouldEvict: SelectKeep (value
//        ranges from the cache's V rows when value_protection > 0), then
//        SequenceCache::Compact + CompactState with the same keep list.
//      - layer_shared() policies (TOVA): p = the mean over all query heads (SumOverHeads,
//        all ranks' heads under tensor parallelism), one
//        state, one keep list applied to every KV head of the layer (value range: max over
//        the layer's KV heads).
//   4. TrimBlocks() if anything was compacted, so the pool gets the memory back at once.
// SelectKeep gets the value ranges of the slots when value_protection > 0 or the policy
// needs_value_range() (VaSE), the slots' K rows gathered to [len, head_dim] when it
// needs_keys() (R-KV), and as seed context (session, layer, kv_head_offset + head, number of
// earlier evictions of that (layer, head)), which does not depend on how many heads this
// rank holds.
//
// Two-phase selection. With PolicyOptions::meta_score != kNone (CAOTE, caote.h) the keep list
// comes from ScoreCandidates (the policy's always-kept slots and candidate scores), the CAOTE
// rescoring of the candidates (V rows read from the cache; kCaoteCurrentQuery also needs
// probs) and SelectUniform. With BudgetOptions::head_adaptive (Ada-KV, head_adaptive.h) a
// layer is evicted when policy.ShouldEvict(sum of its heads' lengths, n_kv_heads * C_l, t)
// says so, and SelectHeadAdaptive chooses n_kv_heads * C_l slots over all its heads, so the
// heads' lengths then differ (last_keep() is the last head's list).
//
// Prefill-time policies (policy().compresses_prefill(), SnapKV): after the prompt's forward
// pass and before the first Step, the engine calls CompressPrefill with the last
// w = min(policy window, prompt length) prompt queries of every layer.
//
// probs: [n_layers, n_heads, stride] laid out as BatchItem::attn_probs:
// probs[(layer * n_heads + qh) * stride + slot]; may be null iff !policy.needs_attention().
// The cache must not be compacted by anyone else between steps (CHECKed).
//
// Hot path: after warm-up (scratch grown to the largest length seen) Step allocates only
// when a state or keep list grows past its previous capacity; Reserve(max_len) avoids
// even that.
//
// Not thread safe: one sequence is stepped by one thread at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/eviction/budget.h"
#include "cache/eviction/candidate_set.h"
#include "cache/eviction/eviction_policy.h"
#include "cache/eviction/head_adaptive.h"
#include "cache/eviction/merge.h"
#include "cache/eviction/tp_sync.h"
#include "cache/sequence_cache.h"
#include "kernels/backend.h"

namespace recall::cache::eviction {

class LazyBackendState;

struct SessionEvictorOptions {
  PolicyOptions policy;
  BudgetOptions budget;  // `reserved` is raised to the policy's min_budget()
  int n_heads = 0;       // query heads of the model (this rank)
  uint64_t session = 0;  // seeds stochastic policies together with PolicyOptions::seed
  // Model-global index of this rank's KV head 0 (tensor parallelism), for the seed context.
  int kv_head_offset = 0;

  // One token set for all KV heads of a layer (EVICTION.md section 5, "one token set shared by
  // all heads"): a slot's probability for the layer is the max over all the layer's query
  // heads (every rank's: all-reduced MAX, which is exact), the policy keeps one state per
  // layer, identical on every rank, and every head keeps the same slots. Value ranges are the
  // max over the layer's KV heads (all ranks'); CAOTE sums over them (all ranks'). For
  // decode-time policies that need no keys (not snapkv, not rkv); layer-shared policies (TOVA)
  // always work this way (their mean over query heads is summed over ranks in double).
  bool share_tokens = false;
  // Tensor parallelism: this rank's communicator, or null for one rank. With a communicator
  // the cache holds this rank's KV heads, n_heads is the rank's query heads, kv_head_offset
  // its first KV head and total_kv_heads the model's (0 means the cache's n_kv_heads). Every
  // rank's evictor must be created with the same options (but for kv_head_offset) and
  // stepped in lockstep. Modes:
  //  - uniform per-head counts (neither share_tokens nor budget.head_adaptive): each rank
  //    decides for its own heads; no communication beyond the step broadcast (TOVA excepted);
  //  - share_tokens: as above, one all-reduce per layer and step;
  //  - budget.head_adaptive (Ada-KV): the candidate sets of all ranks are all-gathered when a
  //    layer evicts, so every rank computes the same exact global top-k over all KV heads.
  // Each Step starts by broadcasting rank 0's step counter (the request-level decision);
  // a rank whose counter differs fails the step (Internal).
  kernels::Communicator* comm = nullptr;
  int total_kv_heads = 0;
  // Debug check: every Step (and CompressPrefill) all-gathers a checksum of the kept indices
  // and fails loudly (Internal, naming the ranks) if the ranks disagree. Costs one small
  // all-gather per step.
  bool verify_keep = false;
  // A budget given as a fraction refers to the sequence's length (SequenceCache::
  // sequence_length()) up to this many tokens, and to this many past it (the model's context
  // length, for sessions longer than it); 0: no cap.
  int64_t fraction_cap = 0;
  // The backend whose memory holds the cache. When its memory is not host-accessible (a GPU)
  // and the policy is lazy with per-KV-head token sets (not share_tokens or head_adaptive; no
  // meta score or value protection), the evictor steps on the backend: ts and mri live in
  // its memory, each Step is one fused Backend::LazyObserve over probabilities that stay
  // there, and an eviction step (every W steps) is one Backend::LazyEvict, which selects and
  // compacts there too: only the keep lists come to the host. Null, or any other case:
  // everything on the host.
  kernels::Backend* backend = nullptr;
};

// The tensor-parallel eviction modes by name (EVICTION.md section 5): "uniform" (per-head
// counts, the default), "shared" (share_tokens) and "head-adaptive" (budget.head_adaptive).
const std::vector<std::string>& TpEvictionModes();
// Sets `options` for `mode`; InvalidArgument naming the modes for an unknown one.
absl::Status ApplyTpEvictionMode(const std::string& mode, SessionEvictorOptions& options);
// Why `options`' TP eviction mode does not apply to `policy` (e.g. "shared does not apply to
// policy 'rkv': it scores each KV head by its own keys"), or "" when it does.
std::string TpEvictionConflict(const EvictionPolicy& policy, const SessionEvictorOptions& options);

class SessionEvictor {
 public:
  // InvalidArgument for bad policy/budget options or n_heads not a positive multiple of the
  // cache's n_kv_heads. The cache must outlive the evictor.
  static absl::StatusOr<std::unique_ptr<SessionEvictor>> Create(
      const SessionEvictorOptions& options, SequenceCache* cache);
  ~SessionEvictor();

  // One decode step, see above. InvalidArgument if probs is null while the policy needs
  // attention, or stride < the longest (layer, head) length; FailedPrecondition for a
  // compresses_prefill() policy before CompressPrefill; nothing is changed then. probs are
  // needed as well when meta_score is kCaoteCurrentQuery.
  absl::Status Step(const float* probs, int64_t stride);
  // True when Step takes its probabilities in the backend's memory and updates the state
  // there (see SessionEvictorOptions::backend). The caller then passes probabilities the
  // forward pass left in backend memory (BatchItem::probs_on_backend).
  bool steps_on_backend() const { return backend_state_ != nullptr; }
  // The length a budget fraction applies to: the sequence's length, capped at fraction_cap.
  int FractionLength() const {
    const int64_t n = cache_->sequence_length();
    return static_cast<int>(options_.fraction_cap > 0 ? std::min(n, options_.fraction_cap) : n);
  }
  // The most slots any (layer, KV head) keeps after an eviction at the current length.
  int MaxBudget();
  // Brings the host copy of the states (state()) up to date when the evictor steps on the
  // backend (a no-op otherwise); the backend's first error, if any.
  absl::Status SyncStates();

  // One-time prompt compression for policies that compresses_prefill() (SnapKV). Call once,
  // after the whole prompt's K/V are in the cache and before the first Step.
  //   window_queries: [n_layers, w, n_heads, head_dim]: for every layer, the query vectors
  //                   (after RoPE, before any scaling) of the LAST w prompt tokens, oldest
  //                   first, all n_heads query heads of this rank;
  //   w:              min(policy().options().window, prompt length);
  //   scale:          the attention logit scale; 0 means 1 / sqrt(head_dim).
  // Per layer l and KV head h with more slots than the layer's budget C_l: SnapKV's window
  // scores over the cached K rows, then Compact to C_l slots; then TrimBlocks.
  // FailedPrecondition if the policy does not compress at prefill, or Step or CompressPrefill
  // was called already; InvalidArgument if window_queries is null or w is not the value
  // above (nothing changed then). For such policies Step is FailedPrecondition until
  // CompressPrefill succeeded (even when the prompt fits the budget), so an engine that does
  // not wire the hook fails loudly instead of silently running FullKV.
  absl::Status CompressPrefill(const float* window_queries, int w, float scale = 0.0f);

  // The cache took its newest slots back out (SequenceCache::DropNewest): each state keeps as
  // many slots as its (layer, head) still has (on the backend too). What those slots' steps
  // did to the others (evictions, merges, scores) stays.
  void FollowDrop();

  // Pre-sizes states and scratch for `max_len` slots per head (optional). The states then
  // hold that room for good, and state_bytes() counts it: a caller that measures memory
  // leaves it out (the states grow as they need and give back what they stop using).
  void Reserve(int max_len);

  // The cache may hold past its budget already, left mid-lag by another evictor (an episode's
  // parked cache, switched back to): the next Step is one at which a lagged policy
  // (EvictionPolicy::eviction_lag) evicts, so the cache holds at most budget + lag + 1 as it
  // would under one evictor. (Made afresh, the evictor waited up to a whole lag: an episodic
  // session at the largest budget its context allows filled the context and failed its turn.)
  void EvictAtNextStep();

  int step() const { return step_; }
  const EvictionPolicy& policy() const { return *policy_; }
  // Number of (layer, KV head) compactions performed, and slots evicted in total.
  int64_t evictions() const { return evictions_; }
  int64_t evicted_slots() const { return evicted_slots_; }
  // The bytes the policy's per-slot state holds (its HeadState arrays, and the backend's copy
  // when it steps there): memory the session holds beside its KV cache, as long as it lives.
  // Scratch (probabilities, selection buffers) is working memory of a running step, sized by
  // one head's length, and not counted.
  int64_t state_bytes() const;
  // The cache's bytes and the state's: what the session holds for its cache now.
  int64_t held_bytes() const { return cache_->bytes_held() + state_bytes(); }
  // The most held_bytes() at any point the evictor saw: in every step once the step's slots
  // are in the cache and the states, before any eviction (and before prompt compression).
  // Callers that see other points (after a prefill) take the max with their held_bytes().
  int64_t peak_kv_bytes() const { return peak_bytes_; }
  // held_bytes() at that point of the last Step or CompressPrefill.
  int64_t step_peak_bytes() const { return step_peak_bytes_; }
  int64_t final_kv_bytes() const { return cache_->bytes_held(); }
  // Budgets used at the last step, [n_layers].
  const std::vector<int32_t>& budgets() const { return budgets_; }
  // State of (layer, head); for layer_shared() policies head must be 0. When the evictor
  // steps on the backend, as of the last eviction step or SyncStates().
  const HeadState& state(int layer, int head) const;
  // The keep list of the last SelectKeep call of the last Step (for tests and TP checksums).
  const std::vector<int32_t>& last_keep() const { return keep_; }

 private:
  SessionEvictor(const SessionEvictorOptions& options, std::unique_ptr<EvictionPolicy> policy,
                 BudgetAllocator budgets, SequenceCache* cache);

  void NotePeak() {
    step_peak_bytes_ = held_bytes();
    peak_bytes_ = std::max(peak_bytes_, step_peak_bytes_);
  }

  // ---- Tensor parallelism and token sharing (session_evictor_tp.cc).
  // Broadcasts rank 0's step counter; Internal if this rank's next step differs.
  absl::Status AgreeOnStep();
  // One probability per slot for a shared-token layer into reduced_[0, len): the mean over
  // the layer's query heads (layer-shared policies) or their max, over every rank.
  absl::Status ReduceShared(const float* layer_probs, int64_t stride, int len);
  // Head-adaptive selection of one layer (candidates_ filled for every local head) into
  // head_keeps_, over every rank's heads when there is a communicator.
  absl::Status SelectAdaptive(int layer, int budget);
  // The layer's total length for head-adaptive ShouldEvict: summed over the ranks (each
  // model-global KV head counted once).
  absl::StatusOr<int64_t> LayerLength(int64_t local);
  // Compares this step's digests across ranks (verify_keep); resets them.
  absl::Status VerifyStep(int t);

  // Computes value ranges of slots [0, len) of (layer, head) into value_range_ (max with
  // what is there when `accumulate`).
  void ComputeValueRanges(int layer, int head, int len, bool accumulate);
  // Copies the K rows of slots [0, len) of (layer, head) into keys_ ([len, head_dim]).
  void GatherKeys(int layer, int head, int len);
  // Fills ctx's value_range / keys for (layer, head) as the policy needs (value ranges over
  // every head of the layer, all ranks', for shared token sets).
  absl::Status PrepareContext(int layer, int head, int len, SelectContext* ctx);
  // Copies the V rows of slots [begin, end) of (layer, head) into values_.
  void GatherValues(int layer, int head, int begin, int end);
  // Writes to keep_ the slots (layer, head) keeps (head 0 for layer-shared policies): the
  // policy's SelectKeep, or with a meta score the two-phase selection. ctx must be prepared.
  absl::Status SelectForHead(int layer, int head, const HeadState& state, int len, int budget,
                             int t, const float* layer_probs, int64_t stride,
                             const SelectContext& ctx);
  // ScoreCandidates + ApplyMetaScore for (layer, head) into candidates_[head].
  absl::Status ScoreHead(int layer, int head, const HeadState& state, int len, int t,
                         const float* layer_probs, int64_t stride, const SelectContext& ctx);
  // Replaces c's candidate scores by CAOTE's (no-op for kNone). Per-KV-head policies: scores
  // of (layer, head); layer-shared ones: summed over the layer's KV heads.
  absl::Status ApplyMetaScore(int layer, int head, int len, const float* layer_probs,
                              int64_t stride, CandidateSet* c);
  // Head-adaptive eviction of one layer (candidates_ filled for every head): chooses and
  // compacts. Returns true if anything was compacted.
  absl::StatusOr<bool> CompactHeadAdaptive(int layer, int budget, bool with_state);
  // The per-head eviction of layer l (uniform per-head counts): SelectKeep and CompactHead
  // for every head over its budget at step t. Sets *compacted when any head was compacted.
  absl::Status EvictHeads(int layer, int budget, int t, const float* layer_probs, int64_t stride,
                          SelectContext& ctx, bool* compacted);

  // ---- Stepping on the backend (session_evictor_backend.cc; the state: lazy_backend_state.h).
  // Step when backend_state_ is set.
  absl::Status StepOnBackend(const float* probs, int64_t stride);
  // The eviction step on the backend of every (layer, head) over its budget at step t; the
  // keep lists come back for the positions, counters and digest.
  absl::Status EvictOnBackend(int t);

  // With PolicyOptions::merge: merges the slots of (layer, head) that `keep` evicts into the
  // ones it keeps (merge.h), rewriting kept K/V rows in the cache; weights from this layer's
  // probabilities of the step (merge_probs_) when there are any.
  void MergeInto(int layer, int head, int len, const std::vector<int32_t>& keep);
  // Compacts (layer, head) to `keep` (and its state if with_state) and counts it.
  void CompactHead(int layer, int head, int len, const std::vector<int32_t>& keep, bool with_state);
  // Counts one compaction of (layer, head) from len to kept slots.
  void CountEviction(int layer, int head, int len, int kept);
  // Adds keep_, chosen for (layer, head), to the replica digest (when verify_keep).
  void DigestKeep(int layer, int head);
  // keep_ as chosen for (layer, head) of length len: adds it to the replica digest (when
  // verify_keep) and compacts the head to it unless it keeps every slot. Returns whether it
  // compacted.
  bool ApplyKeep(int layer, int head, int len, bool with_state);

  SessionEvictorOptions options_;
  std::unique_ptr<EvictionPolicy> policy_;
  BudgetAllocator allocator_;
  SequenceCache* cache_;
  int n_layers_;
  int n_kv_heads_;
  int head_dim_;
  bool shared_;  // one token set per layer: layer_shared() policy or share_tokens
  int states_per_layer_;
  TpHeads tp_heads_;
  std::vector<HeadState> states_;  // [n_layers * states_per_layer]
  std::vector<int64_t> state_evictions_;  // [n_layers * states_per_layer] evictions so far
  std::vector<int32_t> budgets_;
  int step_ = 0;
  bool prefill_compressed_ = false;  // CompressPrefill succeeded
  int64_t evictions_ = 0;
  int64_t evicted_slots_ = 0;
  int64_t peak_bytes_ = 0;
  int64_t step_peak_bytes_ = 0;
  // Scratch.
  std::vector<float> reduced_;  // [n_kv_heads * stride] or [stride]
  std::vector<float> value_range_;
  std::vector<float> keys_;  // [len, head_dim]
  HeadState prefill_state_;
  std::vector<int32_t> keep_;
  SelectScratch select_;
  std::vector<float> row_;  // one value row widened to fp32
  // Two-phase selection (meta score, head-adaptive budgets).
  bool needs_probs_;                              // Step needs probs
  std::vector<CandidateSet> candidates_;          // [n_kv_heads]
  std::vector<std::vector<int32_t>> head_keeps_;  // [n_kv_heads]
  HeadAdaptiveScratch adaptive_;
  std::vector<float> values_;  // [len, head_dim] gathered V rows
  std::vector<double> caote_a_, caote_c_, caote_o_, caote_sum_;
  // Merging (PolicyOptions::merge): this layer's probabilities of the step, and scratch.
  const float* merge_probs_ = nullptr;
  int64_t merge_stride_ = 0;
  std::vector<float> merge_keys_;
  std::vector<double> merge_a_;
  MergeScratch merge_;
  // Tensor parallelism.
  std::vector<double> sums_;                        // [len] layer-shared mean numerators
  GatherScratch gather_;
  std::vector<CandidateSet> global_candidates_;     // [total_kv_heads]
  std::vector<std::vector<int32_t>> global_keeps_;  // [total_kv_heads]
  KeepDigest common_digest_;   // decisions every rank must share
  KeepDigest replica_digest_;  // decisions for this rank's own heads
  // Stepping on the backend (null: on the host): the state, the cache's lengths at this step
  // and the rows an eviction step evicts.
  std::unique_ptr<LazyBackendState> backend_state_;
  std::vector<int32_t> lens_now_;
  std::vector<int32_t> evict_rows_, evict_keeps_;
};

}  // namespace recall::cache::eviction
