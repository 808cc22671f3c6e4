// EvictionPolicy: decides which KV slots of one (sequence, layer, KV head) to keep.
//
// Contract. A policy object is immutable after creation and holds no per-sequence data: all
// per-slot state lives in a HeadState owned by the caller (one per sequence, layer and KV
// head, or one per layer for layer-shared policies such as TOVA). The state's arrays are in
// SLOT ORDER, parallel to the SequenceCache slots, so the same keep list compacts both
// (SequenceCache::Compact + CompactState).
//
// Step protocol for decode step t (t = 1 is the first decode step after prefill), after the
// step's K/V were appended to the cache:
//   1. AppendSlots(&state, n, t) for the n slots appended since the last step (for t = 1 this
//      covers the whole prompt plus the first decoded token); new slots get ts = t - 1.
//   2. policy.Observe(&state, p, len, t): p[0..len) are this step's attention probabilities
//      of the slots (per KV head: max over its G query heads, see ReduceGqaMax; for
//      layer_shared() policies: the mean over the layer's query heads, see
//      AverageOverHeads). O(len), allocates nothing.
//   3. if policy.ShouldEvict(len, budget, t): policy.SelectKeep(state, len, budget, t, ctx,
//      &keep) writes strictly ascending slot indices; the caller compacts cache and state.
//
// Ranking and ties. Every policy ranks candidate slots by (score descending, slot index
// ascending): among equal scores the OLDER slot (smaller index; slots stay in position
// order under compaction) is kept and the newer one evicted. Everything is deterministic:
// no dependence on thread count, and no randomness except VaSE's sampling, which is a pure
// function of PolicyOptions::seed and the SelectContext seed fields; so two runs and two
// tensor-parallel ranks that see the same probabilities keep the same slots.
//
// Prefill-time policies (compresses_prefill(), SnapKV) do their work once, through
// SessionEvictor::CompressPrefill, before step 1; they never evict at decode.
//
// Value protection (VaSE lesson, EVICTION.md section 3): with
// PolicyOptions::value_protection = f > 0 and SelectContext::value_range set, every policy
// first keeps the floor(f * budget) candidate slots with the largest value range (max - min
// of V over head_dim), then fills the remaining quota by its own score. Slots the policy
// always keeps (recent window, sinks) are not candidates and do not use the quota.
//
// Two-phase selection (SessionEvictor only; SelectKeep alone ignores both options): with
// PolicyOptions::meta_score (CAOTE, caote.h) or BudgetOptions::head_adaptive (Ada-KV,
// head_adaptive.h), SessionEvictor first runs SelectKeep in scoring mode (SelectContext::capture
// set, see candidate_set.h), which yields the slots the policy always keeps and the scores of
// the others; it then rescores (CAOTE) and chooses the kept candidates itself, per head or over
// all heads of the layer. With neither option the result is exactly SelectKeep's.
//
// Thread safety: policies are immutable and may be shared across threads; a HeadState and a
// SelectScratch are used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recall::cache::eviction {

struct CandidateSet;  // candidate_set.h

// One Options struct for every policy; each policy reads the fields it needs.
struct PolicyOptions {
  // "full", "streaming", "h2o", "tova", "lazy", "lazy+", "vase", "rkv", "snapkv".
  std::string name = "full";
  // W: LazyEviction's observation window and protected recent window; H2O's recent window;
  // VaSE's eviction interval and attention window (the paper uses 64); SnapKV's prefill
  // observation window and protected window (32 to 64). Lazy and VaSE evict only at steps t
  // with t % window == 0. Must be >= 1.
  int window = 32;
  // LazyEviction importance threshold: slot j is important at a step iff p_j >= alpha.
  // Default 1e-4 (the released default for Qwen-7B; use 5e-4 for Llama-3-8B).
  float alpha = 1e-4f;
  // lazy+ only: when > 0, a slot is important at a step iff p_j >= alpha_uniform / len, a
  // multiple of the uniform share of the len cached slots, instead of p_j >= alpha. The same
  // value then means the same thing at every budget and cache length (an absolute alpha that
  // suits 100 slots marks almost nothing in 1,000, and 1e-4 marks everything in 512).
  float alpha_uniform = 0.0f;
  // lazy+ only: the attention term of its score. Each slot keeps a decayed sum of the
  // attention it drew, e <- attention_decay * e + p_j at every step, and its score gains
  // attention_weight * r / (1 + r), r = e * (1 - attention_decay) * len (the recent attention
  // as a multiple of the uniform share; r = 1 for a slot that always draws 1 / len). Weight 0
  // gives the recurrence score alone. decay in [0, 1), weight in [0, 1e6]; other policies
  // ignore both.
  float attention_decay = 0.9f;
  float attention_weight = 3.0f;
  // StreamingLLM and VaSE attention sinks: the first `sinks` slots are always kept.
  int sinks = 4;
  // Fraction of the budget reserved for the largest-value-range slots, in [0, 1); 0 = off.
  // VaSE always protects such a quota: this fraction if > 0, else 0.25 (kVaseValueQuota).
  float value_protection = 0.0f;
  // Seed for stochastic policies (VaSE); deterministic policies ignore it.
  uint64_t seed = 0;
  // R-KV: compress every `interval` decode steps (t % interval == 0). Must be >= 1.
  int interval = 128;
  // R-KV: the importance is the mean attention of the last `query_window` queries (clipped to
  // `interval`); the last `query_window` slots are always kept. Must be >= 1.
  int query_window = 8;
  // R-KV: score = lambda * importance - (1 - lambda) * redundancy. In [0, 1].
  float lambda = 0.1f;

  // Value-aware meta-score (CAOTE, EVICTION.md section 4), applied by SessionEvictor on top of
  // the policy (see caote.h for the exact formula):
  //  - kNone: the policy's own ranking.
  //  - kCaote: CAOTE as a meta-heuristic over the policy's score: the candidates' scores,
  //    normalised to sum to 1, stand for the attention probabilities a_j, and the candidates
  //    are ranked by c_j = a_j / (1 - a_j) * ||o - v_j|| with o = sum_i a_i v_i. Only for
  //    policies whose score is a non-negative attention estimate: h2o, tova, snapkv, lazy.
  //  - kCaoteCurrentQuery: a_j is the current decode step's attention probability of slot j
  //    (per KV head: the mean over its G query heads) over all cached slots, o the step's
  //    attention output for that head; c_j replaces the policy's score. Decode-time policies
  //    only (not snapkv); Step then needs probabilities even for policies that do not.
  // The policy's structure is kept either way: always-kept slots (recent window, sinks), when
  // to evict, and value protection.
  enum class MetaScore { kNone, kCaote, kCaoteCurrentQuery };
  MetaScore meta_score = MetaScore::kNone;

  // Merging evicted tokens (merge.h, EVICTION.md section 4): when on, SessionEvictor merges
  // each evicted slot's value (and key, with merge_keys) into the kept slot of the most
  // similar key, if their cosine similarity is at least merge_threshold, weighting by this
  // step's attention (per KV head: the mean over its query heads; equal weights for policies
  // that read no attention). The keep decision and memory are unchanged. Host caches only.
  bool merge = false;
  float merge_threshold = 0.5f;  // in [-1, 1]
  bool merge_keys = false;
};

// The per-slot arrays a HeadState keeps (EvictionPolicy::state_arrays()): a policy keeps
// only those it reads, because they are memory the session holds beside its KV cache, and
// SessionEvictor counts them in the session's peak (EVICTION.md section 6).
enum StateArray : uint32_t {
  kNoStateArrays = 0,
  kTsArray = 1u << 0,
  kMriArray = 1u << 1,
  kScoreArray = 1u << 2,
  kCompactSlotArray = 1u << 3,  // lazy+'s 6-byte slots (CompactSlot)
  kAllStateArrays = kTsArray | kMriArray | kScoreArray | kCompactSlotArray,
};

// One slot of lazy+'s state in 6 bytes (lazy_plus_policy.h): the step of its last importance
// modulo 2^16, its recurrence interval, and its decayed attention sum as an IEEE half whose
// sign bit is the seen flag.
struct CompactSlot {
  uint16_t ts = 0;
  uint16_t mri = 0;
  uint16_t sum = 0;
};
static_assert(sizeof(CompactSlot) == 6, "lazy+'s slot is 6 bytes");

// Per-slot state of one (sequence, layer, KV head), in slot order. The arrays `arrays` names
// have the same size, which must equal the cache's length for that (layer, head) between
// steps; the others stay empty.
struct HeadState {
  HeadState() = default;
  explicit HeadState(uint32_t kept) : arrays(kept) {}

  uint32_t arrays = kAllStateArrays;  // which of ts, mri, score and compact it keeps
  // LazyEviction: last step the slot was important. Every other policy that keeps it leaves
  // it as AppendSlots set it (t - 1 for a slot appended before step t), which VaSE reads to
  // know how many of the window's queries saw the slot.
  std::vector<int32_t> ts;
  std::vector<int32_t> mri;  // LazyEviction: maximum recurrence interval
  // H2O: accumulated attention; TOVA: last step's attention; VaSE, R-KV: attention summed over
  // the current observation window; SnapKV (prefill only): the pooled window score; lazy+:
  // the decayed attention sum, stored negated (sign bit set, -0.0 included) once the slot has
  // been important (lazy_plus_policy.h).
  std::vector<float> score;
  std::vector<CompactSlot> compact;  // lazy+: ts, mri and score in 16 bits each
  int32_t slots = 0;                 // the size when no array is kept
  int32_t reserved = 0;  // Reserve's floor: compaction keeps this much room

  int size() const {
    if (arrays & kTsArray) return static_cast<int>(ts.size());
    if (arrays & kScoreArray) return static_cast<int>(score.size());
    if (arrays & kMriArray) return static_cast<int>(mri.size());
    if (arrays & kCompactSlotArray) return static_cast<int>(compact.size());
    return slots;
  }
  // The bytes the arrays hold (their capacity), which AppendSlots and CompactState keep
  // within a 32nd (and 4 slots) of the most slots it held, or of what Reserve asked for.
  int64_t bytes() const;
  // Pre-sizes the kept arrays so that appends up to `slots` do not allocate (and compaction
  // keeps that room: it is held, and counted in bytes()).
  void Reserve(int slots);
};

// The most bytes a HeadState keeping `arrays` holds while it never holds more than `slots`
// (and Reserve was not called): what it uses and its slack.
int64_t HeadStateBytesBound(uint32_t arrays, int slots);

// Appends `n` slots appended before step t's Observe: ts = t - 1, mri = 0, score = 0 (in the
// arrays the state keeps; a CompactSlot's ts modulo 2^16). Prompt tokens seen at the first decode
// step (t = 1) thus start with ts = 0.
void AppendSlots(HeadState* state, int n, int t);

// Keeps only the slots in `keep` (strictly ascending, within size), moving them to the
// front in order: the same operation as SequenceCache::Compact. CHECKs the precondition.
void CompactState(HeadState* state, const std::vector<int32_t>& keep);

// Scratch memory reused by SelectKeep (no allocation after warm-up).
struct SelectScratch {
  std::vector<double> score;
  std::vector<int32_t> order;
  std::vector<double> aux;  // per-slot intermediate scores (pooling, redundancy)
  std::vector<double> aux2;
  std::vector<float> rows;  // normalized key rows (R-KV)
};

// Everything SelectKeep needs besides the state. `value_range` may be null (then value
// protection is off for this call) unless the policy needs_value_range(); `keys` is set
// for policies that needs_keys(). session/layer/head/eviction_count seed stochastic
// policies reproducibly (identical on every tensor-parallel rank: SessionEvictor passes the
// model-global KV head index and the number of earlier evictions of this (layer, head)).
struct SelectContext {
  const float* value_range = nullptr;  // [len] max - min of V over head_dim, per slot
  const float* keys = nullptr;         // [len, head_dim] K rows of the slots, in slot order
  int head_dim = 0;
  uint64_t session = 0;
  int layer = 0;
  int head = 0;
  int64_t eviction_count = 0;
  SelectScratch* scratch = nullptr;  // REQUIRES: non-null
  // Scoring mode (candidate_set.h): if non-null, SelectKeep appends to *keep only the slots it
  // always keeps and records its candidates and their scores here instead of choosing.
  CandidateSet* capture = nullptr;
};

class EvictionPolicy {
 public:
  explicit EvictionPolicy(const PolicyOptions& options) : options_(options) {}
  virtual ~EvictionPolicy() = default;
  EvictionPolicy(const EvictionPolicy&) = delete;
  EvictionPolicy& operator=(const EvictionPolicy&) = delete;

  virtual absl::string_view name() const = 0;

  // True if the policy reads attention probabilities (Observe is a no-op otherwise and the
  // caller may skip computing them).
  virtual bool needs_attention() const { return true; }
  // True if one keep set is shared by all KV heads of a layer (TOVA): the caller keeps one
  // HeadState per layer, feeds it the mean over the layer's query heads and compacts every
  // head with the same keep list.
  virtual bool layer_shared() const { return false; }
  // Smallest budget the policy accepts (e.g. the recent window). Budgets below it are
  // raised to it by the caller (BudgetOptions::reserved).
  virtual int min_budget() const { return 1; }
  // True if SelectKeep needs SelectContext::value_range even with value_protection = 0.
  virtual bool needs_value_range() const { return false; }
  // True if SelectKeep needs SelectContext::keys.
  virtual bool needs_keys() const { return false; }
  // True if the policy compresses the prompt once at prefill from the last prompt queries
  // (SnapKV): the engine must call SessionEvictor::CompressPrefill before the first Step.
  virtual bool compresses_prefill() const { return false; }
  // Whether the backend has this policy's whole decode step as ops (Backend::LazyObserve and
  // Backend::LazyEvict), so a GPU cache can step it without copying probabilities back. Only
  // LazyEviction so far.
  virtual bool has_backend_step() const { return false; }
  // The HeadState arrays the policy reads and writes (StateArray bits); the caller keeps
  // only these.
  virtual uint32_t state_arrays() const = 0;

  // Updates `state` with step t's probabilities p[0..len).
  // REQUIRES: state->size() == len, t >= 1.
  virtual void Observe(HeadState* state, const float* p, int len, int t) const = 0;

  // Whether to evict at step t with `len` slots and budget `budget` tokens.
  virtual bool ShouldEvict(int len, int budget, int t) const = 0;
  // The most decode steps a (layer, head) may grow past its budget before ShouldEvict says
  // so: 0 for a policy that evicts at every step over budget, its window (or interval) for a
  // lagged one. A session past the context needs budget + lag + 1 slots of it.
  virtual int eviction_lag() const { return 0; }

  // Writes to *keep the strictly ascending slot indices to keep, exactly min(len, budget)
  // of them. REQUIRES: state.size() == len, budget >= min_budget(), ctx.scratch != null.
  virtual void SelectKeep(const HeadState& state, int len, int budget, int t,
                          const SelectContext& ctx, std::vector<int32_t>* keep) const = 0;

  const PolicyOptions& options() const { return options_; }

 private:
  const PolicyOptions options_;
};

// The names CreatePolicy accepts, in order, for messages and parameterized tests.
const std::vector<std::string>& PolicyNames();
// Whether `name` is one of PolicyNames() other than full (one that evicts), and those names
// joined by ", " for messages.
bool IsEvictingPolicy(const std::string& name);
std::string EvictingPolicyList();

// Whether the policy's score is a non-negative attention estimate, which CAOTE
// (MetaScore::kCaote) rescores: h2o, tova, snapkv, lazy, lazy+.
bool TakesCaote(const std::string& policy);
// Whether the policy reads PolicyOptions::alpha (its importance threshold): lazy, lazy+.
bool TakesAlpha(const std::string& policy);

// InvalidArgument for an unknown name (the message lists the valid names) or an
// out-of-range option (the message names the field and the limit).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> CreatePolicy(const PolicyOptions& options);

// GQA reduction for one layer: out[kh * stride + j] = max over the G = n_heads / n_kv_heads
// query heads qh = kh * G + g of probs[qh * stride + j], for j < lengths[kh].
//   probs:   [n_heads, stride]    one layer's slice of BatchItem::attn_probs
//   lengths: [n_kv_heads]          slots per KV head
//   out:     [n_kv_heads, stride]
// Deviation from the released LazyEviction code, which keeps KV per query head and so one
// state per query head: we keep KV per KV head, so a slot is important for its KV head iff
// it is important for ANY query head of the group (max >= alpha), its ts is the latest
// step any of them found it important, and it is kept or evicted for all G heads together.
// With G = 1 (or n_kv_heads = n_heads) this is the identity, i.e. the per-query-head mode.
// REQUIRES: n_heads % n_kv_heads == 0, lengths[kh] <= stride.
void ReduceGqaMax(const float* probs, int n_heads, int n_kv_heads, int64_t stride,
                  const int32_t* lengths, float* out);

// TOVA's per-layer reduction: out[j] = mean over the layer's n_heads query heads of
// probs[qh * stride + j], j < len, summed in double (SumOverHeads).  probs: [n_heads, stride],
// out: [len].
void AverageOverHeads(const float* probs, int n_heads, int64_t stride, int len, float* out);

// sums[j] = sum over the n_heads query heads of probs[qh * stride + j], j < len, in double
// (so that tensor-parallel ranks can add their partial sums without changing the float mean).
void SumOverHeads(const float* probs, int n_heads, int64_t stride, int len, double* sums);

// Value range of one V row: max_d v_row[d] - min_d v_row[d]. v_row: [head_dim].
float ValueRange(const float* v_row, int head_dim);

}  // namespace recall::cache::eviction
